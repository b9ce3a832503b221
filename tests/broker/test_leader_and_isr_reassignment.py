"""A broker keeps the adding and removing replicas of a LeaderAndIsr (v3+) in its partition's
assignment state, as Kafka's Partition.updateAssignmentAndIsr (OngoingReassignmentState while
they are set, SimpleAssignmentState once a request comes without them)."""

from __future__ import annotations

from harness import ActingController, BrokerThread


def test_the_partition_keeps_the_moving_replicas_of_its_last_leader_and_isr(
        one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("moving", {0: [1]})
    p = one_broker.partition("moving", 0)
    assert not p.is_reassigning and (p.adding_replicas, p.removing_replicas) == ((), ())
    # Phase A of [1] -> [2]: RS = [2, 1], broker 2 joining, this broker leaving.
    controller.states[("moving", 0)].update(
        leader_epoch=1, replicas=[2, 1], adding_replicas=[2], removing_replicas=[1])
    assert controller.send_leader_and_isr("moving", [0])[1].error_code == 0
    p = one_broker.partition("moving", 0)
    assert p.is_reassigning and p.assigned_replicas == (2, 1)
    assert (p.adding_replicas, p.removing_replicas) == ((2,), (1,))
    assert "adding [2] removing [1]" in one_broker.call(lambda: repr(p))
    # Cancelled: RS = [1] again with nothing moving.
    controller.states[("moving", 0)].update(
        leader_epoch=2, replicas=[1], adding_replicas=[], removing_replicas=[])
    assert controller.send_leader_and_isr("moving", [0])[1].error_code == 0
    p = one_broker.partition("moving", 0)
    assert not p.is_reassigning and (p.adding_replicas, p.removing_replicas) == ((), ())
