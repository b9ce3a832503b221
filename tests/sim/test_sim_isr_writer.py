"""The simulator's ISR writer (a node's AlterPartitionManager, AlterPartition to the simulated
controller) is refused an ISR whose member is unregistered or named with another broker epoch
than its registration's: the controller's INELIGIBLE_REPLICA (KIP-841/903), the code the real
controller runs (ControllerCore.alter_partition)."""

from __future__ import annotations

from tidelog.replication.types import ProposeIsr
from tidelog.sim.cluster import SimCluster, SimConfig
from tidelog.sim.messages import CONTROLLER_CHANNEL_NODE


def _propose(c: SimCluster, members: tuple[tuple[int, int], ...]) -> list[tuple[bool, int]]:
    """Broker 0 (the leader) writes an ISR of ``members`` (id, broker epoch); the answers."""
    tp = c.tps[0]
    s = c.zk_state(tp)
    assert s is not None and s.leader == 0
    answers: list[tuple[bool, int]] = []
    manager = c.nodes[0].alter_partition
    assert manager is not None
    manager.submit(ProposeIsr(tp, 0, s.leader_epoch, tuple(m for m, _ in members),
                                 s.zk_version, s.controller_epoch, members),
                      lambda ok, version: answers.append((ok, version)))
    c.run_for(100)
    return answers


def test_a_member_named_with_an_earlier_registration_is_refused() -> None:
    c = SimCluster(SimConfig())
    c.start()
    c.run_for(200)
    tp = c.tps[0]
    e0, e1 = c.nodes[0].broker_epoch, c.nodes[1].broker_epoch
    assert _propose(c, ((0, e0), (1, e1 - 1))) == [(False, -1)]
    assert _propose(c, ((0, e0), (3, -1))) == [(False, -1)]  # no broker 3 registered
    assert set(c.zk_state(tp).isr) == {0, 1, 2}
    # The epochs of the registrations (or -1, unchecked): written.
    [(ok, _)] = _propose(c, ((0, e0), (1, -1)))
    assert ok and c.zk_state(tp).isr == (0, 1)


def _shrink_to_0_and_1(c: SimCluster, answers: list[tuple[bool, int]]) -> None:
    tp = c.tps[0]
    s = c.zk_state(tp)
    manager = c.nodes[0].alter_partition
    assert manager is not None and s is not None
    manager.submit(ProposeIsr(tp, 0, s.leader_epoch, (0, 1), s.zk_version, s.controller_epoch,
                              ((0, c.nodes[0].broker_epoch), (1, c.nodes[1].broker_epoch))),
                   lambda ok, version: answers.append((ok, version)))


def test_an_alter_partition_on_its_way_to_a_controller_that_fails_over_is_sent_again() -> None:
    c = SimCluster(SimConfig())
    c.start()
    c.run_for(200)
    old_epoch = c.zk_state(c.tps[0]).controller_epoch
    c.network.link(0, CONTROLLER_CHANNEL_NODE).extra_delay_ms = 300
    answers: list[tuple[bool, int]] = []
    _shrink_to_0_and_1(c, answers)
    c.run_for(50)
    c.failover_controller()  # the request is on its way: lost with the old one's connections
    c.network.link(0, CONTROLLER_CHANNEL_NODE).extra_delay_ms = 0
    manager = c.nodes[0].alter_partition
    assert manager is not None
    c.run_for(c.config.request_timeout_ms + 200)
    assert manager.retries == 1 and [ok for ok, _ in answers] == [True]
    s = c.zk_state(c.tps[0])
    assert s.isr == (0, 1) and s.controller_epoch == old_epoch + 1  # the new one wrote it


def test_the_old_controllers_answer_on_its_way_at_a_failover_still_arrives() -> None:
    c = SimCluster(SimConfig())
    c.start()
    c.run_for(200)
    old_epoch = c.zk_state(c.tps[0]).controller_epoch
    c.network.link(CONTROLLER_CHANNEL_NODE, 0).extra_delay_ms = 300
    answers: list[tuple[bool, int]] = []
    _shrink_to_0_and_1(c, answers)
    c.run_for(50)
    s = c.zk_state(c.tps[0])
    assert s.isr == (0, 1) and s.controller_epoch == old_epoch and answers == []
    c.failover_controller()
    c.run_for(300)
    manager = c.nodes[0].alter_partition
    assert manager is not None and manager.retries == 0
    assert answers == [(True, s.zk_version)]
