"""The log manager's periodic tasks run on the shell's scheduler: the simulator (virtual time,
`MemoryFileIO`) runs retention and the recovery-point checkpoint of the broker that ships; the
first runs come after log.initial.task.delay.ms, as Kafka's."""

from __future__ import annotations

from test_shell_replica_manager import Clock

from tidelog.protocol.records.builder import build_values
from tidelog.protocol.topic_partition import TopicPartition
from tidelog.shell.log_tasks import LogTaskIntervals, schedule_log_tasks
from tidelog.sim.cluster import SimCluster, SimConfig
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager


def booted(**kw: object) -> SimCluster:
    c = SimCluster(SimConfig(**kw))  # type: ignore[arg-type]
    c.start()
    c.run_for(200)
    return c


def test_retention_deletes_old_segments_on_every_replica_in_the_simulator() -> None:
    c = booted(topic_properties={"segment.ms": 500, "retention.ms": 1000})
    tp = c.tps[0]
    p = c.add_producer(tp, -1)
    for _ in range(40):
        p.produce(1)
        c.run_for(100)
    c.run_for(7000)  # two retention checks at least (every 3 s of virtual time)
    assert len(p.acked) == 40
    # Segments rolled every 500 ms of virtual time and older than 1 s went: with no task
    # running retention, every log would still start at 0.
    assert all(n.log(tp).log_start_offset > 0 for n in c.nodes)
    assert c.final_checks() == [] and c.checker.violations == []


def test_recovery_points_are_checkpointed_while_the_broker_runs() -> None:
    c = booted()
    tp = c.tps[0]
    p = c.add_producer(tp, -1)
    p.produce(5)
    c.run_for(4500)  # first after the initial task delay (3 s of virtual time), then every 2 s
    for n in c.nodes:
        data = n.file_io.read_file(f"{n.log_dirs[0]}/recovery-point-offset-checkpoint").decode()
        # version, count, then "<topic> <partition> <recovery point>"
        assert f"{tp.topic} {tp.partition} " in data


def test_retention_first_runs_at_the_initial_task_delay_then_every_period() -> None:
    """Kafka 3.9's LogManager.startup: the retention check first runs after
    log.initial.task.delay.ms (30 s by default), not one log.retention.check.interval.ms in
    (5 min), so records stamped 1970 are gone 30 s after start."""
    clock = Clock()
    lm = LogManager(["/b1"], LogConfig(retention_ms=1000), MemoryFileIO())
    log = lm.get_or_create_log("t", 0)
    for _ in range(3):
        log.append_as_leader(build_values([b"old"], base_timestamp=1), 0, clock.now)
        log.roll(clock.now)
    log.update_high_watermark(log.log_end_offset)
    schedule_log_tasks(lm, clock, clock, LogTaskIntervals())

    clock.advance(29_999)
    assert log.log_start_offset == 0  # the first check has not run yet
    clock.advance(1)
    assert log.log_start_offset == 3  # at 30 s, not at 300 s

    log.append_as_leader(build_values([b"old"], base_timestamp=1), 0, clock.now)
    log.roll(clock.now)
    log.update_high_watermark(log.log_end_offset)
    clock.advance(299_999)
    assert log.log_start_offset == 3  # the next check is one period after the first
    clock.advance(1)
    assert log.log_start_offset == 4


def test_retention_reports_each_partition_whose_log_start_moved() -> None:
    """Fetch sessions read only changed partitions, so retention must report the partitions
    whose log start offset it moved, or followers and consumers would not learn it until the
    partition's next append."""
    clock = Clock()
    lm = LogManager(["/b1"], LogConfig(retention_ms=1000), MemoryFileIO())
    expired, fresh = lm.get_or_create_log("t", 0), lm.get_or_create_log("t", 1)
    for log, ts in ((expired, 1), (fresh, 10**13)):
        log.append_as_leader(build_values([b"v"], base_timestamp=ts), 0, clock.now)
        log.roll(clock.now)
        log.update_high_watermark(log.log_end_offset)
    moved: list[TopicPartition] = []
    schedule_log_tasks(lm, clock, clock, LogTaskIntervals(), moved.append)

    clock.advance(30_000)  # the first retention check
    assert moved == [TopicPartition("t", 0)]
    assert expired.log_start_offset == 1 and fresh.log_start_offset == 0
    clock.advance(300_000)  # nothing moves on the next check: nothing reported
    assert moved == [TopicPartition("t", 0)]


def test_a_deleted_partitions_dir_goes_when_file_delete_delay_ms_has_passed() -> None:
    """Kafka's kafka-delete-logs: first after log.initial.task.delay.ms, then at the next
    retired dir's due time (not at a later retention check)."""
    clock = Clock()
    fio = MemoryFileIO()
    lm = LogManager(["/b1"], LogConfig(file_delete_delay_ms=60_000), fio)
    lm.get_or_create_log("t", 0).append_as_leader(build_values([b"v"]), 0, clock.now)
    schedule_log_tasks(lm, clock, clock, LogTaskIntervals())
    clock.advance(45_000)  # the task ran once (at 30 s), with nothing to remove
    lm.delete_log("t", 0, clock.now)
    (retired,) = [n for n in fio.listdir("/b1") if n.endswith("-delete")]
    clock.advance(59_999)
    assert retired in fio.listdir("/b1")
    clock.advance(1)  # 60 s after the deletion
    assert retired not in fio.listdir("/b1")
