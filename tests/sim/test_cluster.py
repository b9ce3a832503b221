"""A simulated cluster over the real core and storage: boot, replicate, crash, recover; and the
invariant checker sees a broken state when one is forced."""

from __future__ import annotations

from tidelog.sim.cluster import SimCluster, SimConfig
from tidelog.sim.invariants import batch_signatures


def booted(**kw: object) -> SimCluster:
    c = SimCluster(SimConfig(**kw))  # type: ignore[arg-type]
    c.start()
    c.run_for(200)
    return c


def test_boot_elects_a_leader_with_a_full_isr_and_brokers_get_epochs() -> None:
    c = booted()
    tp = c.tps[0]
    s = c.zk_state(tp)
    assert s is not None and s.leader == 0 and set(s.isr) == {0, 1, 2}
    assert c.acting_leader(tp) is c.nodes[0]
    epochs = [n.broker_epoch for n in c.nodes]
    assert all(e > 0 for e in epochs) and len(set(epochs)) == 3


def test_acked_writes_are_replicated_and_consumed_below_the_hw() -> None:
    c = booted()
    tp = c.tps[0]
    p = c.add_producer(tp, -1)
    cons = c.add_consumer(tp)
    for _ in range(20):
        p.produce(1)
        c.run_for(10)
    c.run_for(500)
    assert len(p.acked) == 20
    assert c.converged()
    assert sorted(cons.consumed) == sorted(p.acked.values())
    assert c.final_checks() == [] and c.checker.violations == []


def test_lossy_crash_of_a_follower_recovers_from_the_leader() -> None:
    c = booted(os_flush_ms=10**9)
    tp = c.tps[0]
    p = c.add_producer(tp, -1)
    p.produce(10)
    c.run_for(300)
    c.nodes[2].stop("lossy", tear=True)
    assert c.nodes[2].file_io.crashes == 1
    c.run_for(2000)
    c.nodes[2].start()
    assert c.settle(20_000)
    assert c.final_checks() == []
    logs = [batch_signatures(n.log(tp)) for n in c.nodes]
    assert logs[0] == logs[1] == logs[2] and len(logs[0]) == 10


def test_a_paused_broker_loses_its_session_and_comes_back_with_a_new_epoch() -> None:
    c = booted()
    old = c.nodes[1].broker_epoch
    c.nodes[1].pause()
    c.run_for(3 * c.config.session_timeout_ms)
    assert 1 not in c.controller.core.live_brokers
    assert 1 not in c.zk_state(c.tps[0]).isr
    c.nodes[1].resume()
    c.run_for(1000)
    assert c.nodes[1].broker_epoch > old
    assert c.controller.core.live_brokers[1] == c.nodes[1].broker_epoch
    assert c.settle(20_000)


def test_leader_failure_moves_leadership_with_a_new_epoch() -> None:
    c = booted()
    tp = c.tps[0]
    c.nodes[0].stop("kill")
    c.run_for(3 * c.config.session_timeout_ms)
    s = c.zk_state(tp)
    assert s.leader in (1, 2) and s.leader_epoch == 1 and 0 not in s.isr
    assert c.controller.stats.elections >= 2


def test_checker_reports_a_forced_high_watermark_past_a_members_log_end() -> None:
    c = booted()
    tp = c.tps[0]
    p = c.add_producer(tp, -1)
    p.produce(5)
    c.run_for(300)
    # Cut follower 2's log under the leader's HW behind the core's back: a broken state.
    c.nodes[2].log(tp).truncate_to(2)
    c.run_for(200)
    kinds = {v.invariant for v in c.checker.violations}
    assert "ValidHighWatermark" in kinds


def test_checker_reports_two_leaders_in_one_epoch() -> None:
    c = booted()
    tp = c.tps[0]
    c.checker.leaders_by_epoch[(tp, 0)] = 2  # as if broker 2 had led epoch 0 before
    c.run_for(200)
    assert any(v.invariant == "OneLeaderPerEpoch" for v in c.checker.violations)


def test_brokers_obey_the_current_controller_and_refuse_an_older_one() -> None:
    from dataclasses import replace

    from tidelog.controller.core import LeaderAndIsrRequest
    from tidelog.sim.messages import CONTROLLER_NODE, ControllerMessage

    c = booted()
    tp = c.tps[0]
    old = c.controller
    c.failover_controller()
    c.run_for(200)
    new = c.controller
    assert new.core.controller_epoch == old.core.controller_epoch + 1
    state = c.zk_state(tp)

    def send(controller_epoch: int, leader_epoch: int) -> None:
        forged = replace(state, leader=1, leader_epoch=leader_epoch, isr=(1,),
                         controller_epoch=controller_epoch)
        req = LeaderAndIsrRequest(CONTROLLER_NODE, controller_epoch, c.nodes[1].broker_epoch,
                                  (forged,), (1,))
        c.network.send(CONTROLLER_NODE, 1, ControllerMessage(req))
        c.run_for(50)

    send(old.core.controller_epoch, state.leader_epoch + 1)
    assert not c.nodes[1].partition(tp).is_leader
    send(new.core.controller_epoch, state.leader_epoch + 1)
    assert c.nodes[1].partition(tp).is_leader


def test_checker_reports_different_batches_below_the_hw_on_an_isr_member() -> None:
    from tidelog.protocol.records.builder import build_values

    c = booted()
    tp = c.tps[0]
    p = c.add_producer(tp, -1)
    p.produce(3)
    c.run_for(300)
    # Replace follower 1's last committed batch by another one at the same offset.
    log = c.nodes[1].log(tp)
    log.truncate_to(2)
    log.append_as_follower(build_values([b"impostor"], base_offset=2), 0)
    # Nothing else changes (same HW, same ISR): the periodic whole-prefix comparison finds it.
    c.run_for(10_000)
    assert any(v.invariant == "StrongIsr" for v in c.checker.violations)


def test_fault_injector_keeps_a_broker_up_and_one_lossy_recovery_at_a_time() -> None:
    from tidelog.sim.faults import FaultInjector

    c = booted()
    inj = FaultInjector(c, ("crash", "pause"), mean_interval_ms=100)
    worst = [0]

    def watch() -> None:
        c.checker.check()
        down = sum(1 for n in c.nodes if not n.running or n.paused)
        worst[0] = max(worst[0], down)

    c.scheduler.after_event = watch
    inj.start(10)
    c.run_for(20_000)
    inj.stop()
    assert inj.stats.injected.get("crash", 0) >= 5
    assert worst[0] <= c.config.brokers - 1
    with __import__("pytest").raises(ValueError, match="unknown fault"):
        FaultInjector(c, ("meteor",))


def test_checker_reports_a_consumer_served_at_or_above_the_hw() -> None:
    from tidelog.protocol.records.builder import build_values
    from tidelog.replication.types import FetchPartitionData

    c = booted()
    tp = c.tps[0]
    leader = c.nodes[0]
    hw = leader.partition(tp).high_watermark
    # What a buggy read path would hand out: a batch at the HW.
    data = FetchPartitionData(0, high_watermark=hw, records=bytes(build_values([b"x"],
                                                                               base_offset=hw)))
    leader._reply_consumer(2999, 1, tp, data)
    assert any(v.invariant == "ConsumersBelowHw" for v in c.checker.violations)


def test_a_failover_takes_a_leader_that_died_unseen_offline_and_kip966_keeps_it_offline() -> None:
    # Seed 75 (transactional): the old controller resigned as the last ISR member's session
    # expired. The new one sent the dead leader's cached epoch to a follower that registered
    # later (it never fetched again) and, when the leader came back from its unclean shutdown,
    # let it lead that epoch while KIP-966's rule kept the partition "offline": its log and the
    # follower's never converged. Kafka's failover moves a dead broker's replicas to
    # OfflineReplica: the partition has no leader (-1) in a new epoch.
    c = booted()
    tp = c.tps[0]
    for b in (1, 2):
        c.nodes[b].stop("clean")
    c.run_for(3 * c.config.session_timeout_ms)
    before = c.zk_state(tp)
    assert before is not None and before.leader == 0 and before.isr == (0,)
    assert c.controller is not None
    c.controller.resign()  # the old controller misses broker 0's failure
    c.nodes[0].stop("kill")
    c.run_for(3 * c.config.session_timeout_ms)
    c.failover_controller()
    c.run_for(200)
    s = c.zk_state(tp)
    assert s is not None and s.leader == -1 and s.isr == (0,)
    assert s.leader_epoch == before.leader_epoch + 1
    c.nodes[2].start()
    c.run_for(500)
    told = c.nodes[2].partition(tp)
    assert told is not None and told.leader_epoch == s.leader_epoch and not told.is_leader
    c.nodes[0].start()  # back from a kill: no clean leader candidate (KIP-966)
    c.run_for(1000)
    assert c.offline_by_kip966(tp)
    led = c.nodes[0].partition(tp)
    assert led is None or not led.is_leader
    assert c.checker.violations == []


def test_a_failover_keeps_the_leaders_and_isrs_of_live_brokers() -> None:
    # A new controller loads every registered broker before it decides: started one at a time,
    # broker 0's startup found leader 1 not loaded yet and elected 0 in its place, the ISR
    # shrunk to (0,) with 1 and 2 alive and in sync.
    c = booted()
    tp = c.tps[0]
    c.nodes[0].stop("clean")
    c.run_for(3 * c.config.session_timeout_ms)
    c.nodes[0].start()
    assert c.settle(20_000)
    before = c.zk_state(tp)
    assert before is not None and before.leader == 1 and set(before.isr) == {0, 1, 2}
    c.failover_controller()
    c.run_for(200)
    assert c.zk_state(tp) == before
    assert c.controller is not None and c.controller.core.live_brokers.keys() == {0, 1, 2}
