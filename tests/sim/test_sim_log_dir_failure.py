"""A log dir failing under a simulated broker, through the same path as the real broker: the
simulated disk answers EIO (or ENOSPC / EROFS) at the FileIO boundary, the storage reports the
dir to the LogDirFailureChannel, the shell takes its replicas offline and tells the controller
(/log_dir_event_notification) or halts the broker with no dir left; the controller learns which
replicas are offline from the broker's LeaderAndIsr answers (DecisionExecutor, the real
controller's code) and elects leaders elsewhere."""

from __future__ import annotations

import errno

from tidelog.controller import zk_data
from tidelog.replication.errors import Errors
from tidelog.sim.cluster import SimCluster, SimConfig
from tidelog.sim.runner import run_seed


def booted(**kw: object) -> SimCluster:
    c = SimCluster(SimConfig(**kw))  # type: ignore[arg-type]
    c.start()
    c.run_for(300)
    return c


def produce_for(c: SimCluster, ms: int, step_ms: int = 20) -> None:
    for _ in range(ms // step_ms):
        for p in c.producers:
            p.produce(1)
        c.run_for(step_ms)


def fail_dir(c: SimCluster, broker: int, log_dir: str, error: int = errno.EIO) -> None:
    node = c.nodes[broker]
    node.file_io.fail_io(log_dir, error)
    node.failed_dirs.add(log_dir)


def test_a_broker_whose_only_log_dir_fails_halts_and_the_isr_elects_another_leader() -> None:
    c = booted()
    tp = c.tps[0]
    acked = c.add_producer(tp, -1)
    produce_for(c, 300)
    assert c.zk_state(tp).leader == 0
    fail_dir(c, 0, c.nodes[0].log_dirs[0])
    produce_for(c, 3000)
    node = c.nodes[0]
    assert not node.running and node.halts == 1
    s = c.zk_state(tp)
    assert s.leader in (1, 2) and 0 not in s.isr
    assert c.checker.violations == []
    c.heal()
    assert c.settle(30_000)
    assert len(acked.acked) > 50
    assert c.final_checks() == [] and c.checker.violations == []


def test_with_two_log_dirs_only_the_failed_dirs_replicas_go_offline() -> None:
    c = booted(partitions=2, log_dirs_per_broker=2)
    t0, t1 = c.tps
    node = c.nodes[0]
    lm = node.log_manager
    assert lm.log_dir_of[t0] != lm.log_dir_of[t1]  # one partition per dir
    for tp in c.tps:
        c.add_producer(tp, -1)
    produce_for(c, 300)
    assert c.zk_state(t0).leader == 0
    fail_dir(c, 0, lm.log_dir_of[t0])
    produce_for(c, 3000)
    # The broker runs on, without t-0: the controller learned it from its LeaderAndIsr
    # answer after the log dir event, and elected a leader from the rest of the ISR.
    assert node.running and node.halts == 0
    assert node.core.offline_partitions == {t0}
    assert c.controller.core.replicas_on_offline_dirs == {0: {t0}}
    assert c.zk.get_children(zk_data.LOG_DIR_EVENT_NOTIFICATION_PATH) == []  # handled
    s0, s1 = c.zk_state(t0), c.zk_state(t1)
    assert s0.leader in (1, 2) and 0 not in s0.isr
    assert 0 in s1.isr  # its other dir's replica stays in sync
    assert c.checker.violations == []
    c.heal()  # the disk repaired: the broker restarts and t-0 comes back
    assert c.settle(30_000)
    assert 0 in c.controller.core.live_brokers and not c.controller.core.replicas_on_offline_dirs
    assert all(len(p.acked) > 50 for p in c.producers)
    assert c.final_checks() == [] and c.checker.violations == []


def test_a_broker_restarted_with_a_failed_dir_answers_kafka_storage_error_for_its_replicas() -> None:
    c = booted(partitions=2, log_dirs_per_broker=2)
    t0, t1 = c.tps
    node = c.nodes[2]
    failed = node.log_manager.log_dir_of[t0]
    node.stop("kill")
    fail_dir(c, 2, failed)
    node.start()  # the dir is offline from the load on: no notification, only the answers
    c.run_for(3000)
    assert node.running and failed in node.log_manager.offline_dirs
    assert c.controller.core.replicas_on_offline_dirs == {2: {t0}}
    assert 2 not in c.zk_state(t0).isr and 2 in c.zk_state(t1).isr
    assert node.partition(t0) is None and node.partition(t1) is not None
    assert c.checker.violations == []


def test_a_broker_with_no_usable_log_dir_does_not_start() -> None:
    c = booted()
    node = c.nodes[1]
    node.stop("kill")
    fail_dir(c, 1, node.log_dirs[0])
    node.start()
    assert not node.running
    c.run_for(3000)
    assert 1 not in c.controller.core.live_brokers


def test_an_answer_of_an_earlier_registration_changes_nothing() -> None:
    c = booted(partitions=2, log_dirs_per_broker=2)
    ctl = c.controller
    t0 = c.tps[0]
    epoch = ctl.core.live_brokers[1]
    assert ctl.executor.on_leader_and_isr_response(
        1, epoch - 1, {t0: int(Errors.KAFKA_STORAGE_ERROR)}) is None
    assert ctl.core.replicas_on_offline_dirs == {}


def test_random_runs_with_disk_faults_keep_the_invariants() -> None:
    """Seeded runs where log dirs fail among crashes and message loss: with two dirs a broker
    runs on without the failed one's replicas, with one it halts."""
    events = {"log_dir_event": 0, "halt": 0}
    for seed, dirs in ((900, 2), (902, 2), (904, 2), (906, 1), (907, 1)):
        s = run_seed(seed, 8000, brokers=4, partitions=3, faults=("disk", "crash", "drop"),
                     config=SimConfig(log_dirs_per_broker=dirs), full_trace=True)
        assert s.ok, s.report()
        for line in s.trace_tail:
            kind = line.split()[2] if len(line.split()) > 2 else ""
            if kind in events:
                events[kind] += 1
    assert events["log_dir_event"] > 0 and events["halt"] > 0, events


def test_a_replica_moves_to_another_log_dir_while_produced_to_and_survives_a_power_loss() -> None:
    c = booted(partitions=2, log_dirs_per_broker=2, os_flush_ms=10**9)
    t0 = c.tps[0]
    acked = c.add_producer(t0, -1)
    produce_for(c, 500)
    node = c.nodes[0]  # t-0's leader
    source = node.log_manager.log_dir_of[t0]
    dest = next(d for d in node.log_dirs if d != source)
    moves = node.rm.alter_log_dirs_manager
    assert moves.alter_replica_log_dirs({t0: dest}, lambda _tp: True) == {t0: 0}
    produce_for(c, 300)
    assert moves.swaps == 1 and node.log_manager.log_dir_of[t0] == dest
    # The current log's dir was renamed for deletion at the swap, the future one took its name.
    assert [n for n in node.file_io.listdir(source) if n.startswith("t-0")][0].endswith("-delete")
    assert "t-0" in node.file_io.listdir(dest)
    node.stop("lossy")  # the page cache is never written back here: only the move's fsyncs
    c.run_for(3 * c.config.session_timeout_ms)
    node.start()
    assert c.settle(30_000)
    assert node.log_manager.log_dir_of[t0] == dest and len(acked.acked) > 30
    assert c.final_checks() == [] and c.checker.violations == []


def test_a_power_loss_before_a_new_partitions_first_flush_loses_its_dir_and_it_is_recreated() -> None:
    c = booted(os_flush_ms=10**9, hw_checkpoint_ms=10**9)
    t0 = c.tps[0]
    c.zk.set_topic_assignment("t", {0: [0, 1, 2], 1: [0, 1, 2]})  # CreatePartitions
    c.run_for(300)
    c.sync_topic()
    t1 = c.tps[1]
    node = c.nodes[2]
    assert node.log(t1) is not None and "t-1" in node.file_io.listdir(node.log_dirs[0])
    node.stop("lossy")
    # Created without an fsync and never flushed: the partition's dir is gone with the power.
    assert "t-1" not in node.file_io.listdir(node.log_dirs[0])
    for tp in (t0, t1):
        c.add_producer(tp, -1)
    produce_for(c, 500)
    node.start()  # its LeaderAndIsr (not new) creates the log again; the follower catches up
    assert c.settle(30_000)
    assert node.log_end_offset(t1) == c.nodes[0].log_end_offset(t1) > 0
    assert c.final_checks() == [] and c.checker.violations == []
