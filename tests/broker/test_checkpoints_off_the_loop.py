"""The asyncio broker writes its periodic checkpoints (`highwatermark-checkpoint` every 5 s,
`kafka-recovery-point-checkpoint`) on a worker thread, as Kafka writes them on its
KafkaScheduler threads: each file's fsync and its dir's (~12 ms each on a virtual disk) held
the event loop, and every request arriving meanwhile waited (issue 12 item 5: the fixed-rate
p99). Counted by the thread each fsync ran on, not timed."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from tidelog.broker.replica_manager import BrokerReplicaManager
from tidelog.protocol.records.builder import build_values
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.types import LeaderAndIsrPartitionState, TopicPartition
from tidelog.storage.checkpoint import OffsetCheckpointFile
from tidelog.storage.file_io import OsFileHandle, OsFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager

CHECKPOINTS = ("replication-offset-checkpoint", "recovery-point-offset-checkpoint",
               "log-start-offset-checkpoint")


class NotedHandle(OsFileHandle):
    __slots__ = ("_fsyncs",)

    def __init__(self, path: str, fsyncs: list[tuple[str, int]]) -> None:
        super().__init__(path)
        self._fsyncs = fsyncs

    def flush(self) -> None:
        self._fsyncs.append((self.path, threading.get_ident()))
        super().flush()


class FsyncThreads(OsFileIO):
    """Real files; notes the thread of every fsync (a file's or a dir's) with its path."""

    def __init__(self) -> None:
        self.fsyncs: list[tuple[str, int]] = []

    def open(self, path: str) -> OsFileHandle:
        return NotedHandle(path, self.fsyncs)

    def fsync_dir(self, path: str) -> None:
        self.fsyncs.append((path, threading.get_ident()))
        super().fsync_dir(path)


def test_the_checkpoints_fsyncs_run_off_the_event_loops_thread(tmp_path: Path) -> None:
    fio = FsyncThreads()
    log_dir = str(tmp_path / "b1")
    lm = LogManager([log_dir], LogConfig(), fio, 0)

    def checkpoint(name: str) -> dict[tuple[str, int], int]:
        return OffsetCheckpointFile.in_dir(OsFileIO(), log_dir, name).read()

    async def run() -> tuple[int, list[tuple[str, int]]]:
        rm = BrokerReplicaManager(1, lm, ReplicationConfig(), zk_client=None,
                                  endpoint_of=lambda _: None,
                                  high_watermark_checkpoint_interval_ms=50,
                                  recovery_point_checkpoint_interval_ms=50,
                                  log_initial_task_delay_ms=0)
        rm.set_broker_epoch(1)
        rm.become_leader_or_follower(0, 1, 1, [LeaderAndIsrPartitionState(
            "t", 0, 1, 1, 0, (1,), 0, (1,))], {1})
        # (stamped now: retention, which runs too, leaves them)
        records = build_values([b"a", b"b"], base_timestamp=int(time.time() * 1000))
        results = await rm.append_records(1, {TopicPartition("t", 0): records}, 5000)
        assert results[TopicPartition("t", 0)].error == 0
        started = len(fio.fsyncs)  # (the logs' creation fsyncs on this thread, before)
        rm.start()
        try:
            for _ in range(500):  # bounded: 10 s
                if checkpoint(CHECKPOINTS[0]).get(("t", 0)) == 2 and all(
                        os.path.exists(os.path.join(log_dir, n)) for n in CHECKPOINTS[1:]):
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the checkpoints were not written in 10 s")
        finally:
            await rm.shutdown()
        return threading.get_ident(), fio.fsyncs[started:]

    loop_thread, fsyncs = asyncio.run(run())
    lm.shutdown()
    written = [(path, thread) for path, thread in fsyncs
               if os.path.basename(path).removesuffix(".tmp") in CHECKPOINTS or path == log_dir]
    assert {os.path.basename(p).removesuffix(".tmp") for p, _ in written} >= set(CHECKPOINTS)
    on_the_loop = [path for path, thread in written if thread == loop_thread]
    assert on_the_loop == []
