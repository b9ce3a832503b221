"""The log manager's periodic tasks run on the shell's scheduler: the simulator (virtual time,
`MemoryFileIO`) runs retention and the recovery-point checkpoint of the broker that ships."""

from __future__ import annotations

from tidelog.sim.cluster import SimCluster, SimConfig


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
    c.run_for(4500)  # every 2 s of virtual time, the first within 2 s
    for n in c.nodes:
        data = n.file_io.read_file(f"{n.log_dir}/recovery-point-offset-checkpoint").decode()
        # version, count, then "<topic> <partition> <recovery point>"
        assert f"{tp.topic} {tp.partition} " in data
