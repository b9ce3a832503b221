"""A log dir failing under a running broker (Kafka's JBOD handling, ZooKeeper mode), end to end:
two real brokers with two log dirs each and the real controller; broker 1's disk under one dir
fails: it starts answering EIO (a FileIO wrapper at the disk boundary), or, with nothing
simulated, the dir is a small tmpfs that fills up (ENOSPC; skipped where mounting is not
allowed). The scenario and what clients must see: tests/log_dir_failure_scenario.py (run against
Kafka too); here also that broker 1 runs on, serving its other dir."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import log_dir_failure_scenario
import pytest
from harness import BrokerThread, broker_props, wait_until
from zk_chroot import new_chroot

from tidelog.broker.log_dir_failure import set_halt_procedure
from tidelog.client.connection import BrokerConnection
from tidelog.controller.admin import AdminZkClient
from tidelog.controller.controller import KafkaController
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.protocol.messages import fetch as m_fetch
from tidelog.replication.types import TopicPartition
from tidelog.storage.file_io import OsFileHandle, OsFileIO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


class FailingDisk(OsFileIO):
    """Real files until `fail(dir)`: from then on every operation under that dir raises EIO, as a
    dead disk does (files already open too)."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def fail(self, path: str) -> None:
        self.failed.append(os.path.normpath(path))

    def check(self, path: str) -> None:
        p = os.path.normpath(path)
        if any(p == f or p.startswith(f + os.sep) for f in self.failed):
            raise OSError(errno.EIO, "Input/output error (injected)", path)

    def open(self, path: str) -> OsFileHandle:
        self.check(path)
        return _FailingHandle(path, self)

    def listdir(self, path: str) -> list[str]:
        self.check(path)
        return super().listdir(path)

    def makedirs(self, path: str) -> None:
        self.check(path)
        super().makedirs(path)

    def remove(self, path: str) -> None:
        self.check(path)
        super().remove(path)

    def rename(self, src: str, dst: str) -> None:
        self.check(src)
        super().rename(src, dst)

    def fsync_dir(self, path: str) -> None:
        self.check(path)
        super().fsync_dir(path)


class _FailingHandle(OsFileHandle):
    __slots__ = ("disk",)

    def __init__(self, path: str, disk: FailingDisk) -> None:
        super().__init__(path)
        self.disk = disk

    def append(self, data: Any) -> int:
        self.disk.check(self.path)
        return super().append(data)

    def append_parts(self, parts: list[memoryview]) -> int:
        self.disk.check(self.path)
        return super().append_parts(parts)

    def read(self, position: int, size: int) -> bytes:
        self.disk.check(self.path)
        return super().read(position, size)

    def flush(self) -> None:
        self.disk.check(self.path)
        super().flush()

    def truncate(self, size: int) -> None:
        self.disk.check(self.path)
        super().truncate(size)


class Cluster:
    def __init__(self, zk: str, tmp: Path, dirs: dict[int, list[str]], fault: str) -> None:
        self.zk_connect = zk
        self.fault = fault
        self.disk = FailingDisk()
        self.dirs = dirs
        self.brokers: dict[int, BrokerThread] = {}
        for b in (1, 2):
            t = BrokerThread(broker_props(b, zk, tmp, **{
                "log.dirs": ",".join(self.dirs[b]),
                "auto.leader.rebalance.enable": "false",
                "replica.lag.time.max.ms": "2000"}), controller_factory=KafkaController)
            if b == 1 and fault == "eio":
                t.server.file_io = self.disk
            self.brokers[b] = t.start()
        self.zk = KafkaZkClient(zk, session_timeout_ms=6000).start()
        wait_until(lambda: all(len(t.server.metadata_cache.brokers) == 2
                               for t in self.brokers.values()), what="both brokers known")

    def break_dir(self, log_dir: str) -> None:
        if self.fault == "eio":
            self.disk.fail(log_dir)
        else:
            log_dir_failure_scenario.fill(log_dir)  # a real full disk

    def close(self) -> None:
        self.zk.close()
        for t in self.brokers.values():
            t.stop()


@pytest.fixture(params=["eio", "enospc"])
def cluster(request: pytest.FixtureRequest, zookeeper: Any,
            tmp_path: Path) -> Iterator[Cluster]:
    dirs = {b: [str(tmp_path / f"b{b}-d1"), str(tmp_path / f"b{b}-d2")] for b in (1, 2)}
    mounted: list[str] = []
    c: Cluster | None = None
    try:
        if request.param == "enospc":
            for d in dirs[1]:  # both of broker 1's dirs: the test fills the one it needs
                refused = log_dir_failure_scenario.mount_tmpfs(d)
                if refused is not None:
                    pytest.skip(f"mounting a tmpfs is not allowed here: {refused}")
                mounted.append(d)
        c = Cluster(new_chroot(zookeeper), tmp_path, dirs, request.param)
        yield c
    finally:
        if c is not None:
            c.close()
        for d in mounted:
            log_dir_failure_scenario.unmount(d)


def test_a_failed_log_dir_moves_its_leaderships_and_the_broker_serves_its_other_dir(
        cluster: Cluster) -> None:
    b1 = cluster.brokers[1]
    outcome = log_dir_failure_scenario.run(
        cluster.zk, {b: t.port for b, t in cluster.brokers.items()}, cluster.dirs[1],
        cluster.break_dir)
    # Broker 1 runs on with the other dir, its partitions there still served.
    assert b1.call(lambda: b1.server.log_manager.offline_dirs) == {outcome.failing_dir}
    assert all(b1.partition("jbod", p) is None for p in outcome.on_failing)
    assert b1.partition("jbod", 1).is_leader
    # A new controller learns the offline replicas from its failover's LeaderAndIsr answers
    # (Kafka's controller keeps them in memory only, as here).
    def active() -> Any:
        return next((t for t in cluster.brokers.values()
                     if t.server.controller.is_active), None)
    old = wait_until(active, what="an active controller")
    epoch = old.server.controller.controller_epoch
    assert old.call(lambda: old.server.zk_client.resign_controller(
        old.server.controller.epoch_zk_version))
    offline = {TopicPartition("jbod", p) for p in outcome.on_failing}
    wait_until(lambda: (a := active()) is not None and a.server.controller.controller_epoch
               > epoch and a.server.controller.core.replicas_on_offline_dirs == {1: offline},
               what="the new controller's offline replicas")
    print(f"\n{cluster.fault}: leaders moved {outcome.leaders_moved_s:.2f} s after the disk "
          f"failed; the records produced meanwhile acknowledged in {outcome.produce_s:.2f} s")


def test_a_broker_whose_only_log_dir_fails_halts(zookeeper: Any, tmp_path: Path) -> None:
    """As Kafka's LogManager: no log dir left, the process halts (Exit.halt(1), replaced here)."""
    halted: list[int] = []
    disk = FailingDisk()
    t = BrokerThread(broker_props(1, new_chroot(zookeeper), tmp_path / "only"),
                     controller_factory=KafkaController)
    t.server.file_io = disk
    set_halt_procedure(halted.append)
    try:
        t.start()
        zk = KafkaZkClient(t.server.config.get("zookeeper.connect"),
                           session_timeout_ms=6000).start()
        try:
            AdminZkClient(zk).create_topic("solo", 1, 1)
            wait_until(lambda: (p := t.partition("solo", 0)) is not None and p.is_leader,
                       what="solo-0 led")
            disk.fail(str(tmp_path / "only"))
            assert log_dir_failure_scenario.produce_once(t.bootstrap, "solo") is not None
            wait_until(lambda: halted == [1], what="the halt")
            # Nothing told the controller: the broker is gone, its registration with it.
            assert zk.get_all_log_dir_event_notifications() == []
        finally:
            zk.close()
    finally:
        set_halt_procedure(None)
        t.stop()


def _held_fetch(port: int, topic: str, session: bool) -> tuple[float, list[int]]:
    """A consumer's Fetch v12 of an empty partition 0, held up to 30 s for one byte (with
    ``session``: the first incremental fetch of a session opened just before): (the seconds
    until the answer, its partitions' error codes)."""
    def request(max_wait_ms: int, session_id: int, epoch: int, listed: bool) -> Any:
        return m_fetch.FetchRequest(
            max_wait_ms=max_wait_ms, min_bytes=1, session_id=session_id, session_epoch=epoch,
            topics=[m_fetch.FetchTopic(topic, partitions=[m_fetch.FetchPartition(
                0, fetch_offset=0, partition_max_bytes=1 << 20)])] if listed else [])

    async def go() -> tuple[float, list[int]]:
        conn = BrokerConnection("127.0.0.1", port, request_timeout_ms=60_000)
        await conn.connect()
        try:
            held = request(30_000, 0, -1, True)
            if session:
                opened = await conn.send(request(0, 0, 0, True), 12)
                held = request(30_000, opened.session_id, 1, False)
            sent = time.monotonic()
            r = await conn.send(held, 12)
            return time.monotonic() - sent, [p.error_code for t in r.responses
                                             for p in t.partitions]
        finally:
            await conn.close()

    return asyncio.run(go())


def test_fetches_held_on_a_failed_dir_are_answered_at_the_failure(zookeeper: Any,
                                                                  tmp_path: Path) -> None:
    """Kafka's DelayedFetch case D: a partition gone offline with its log dir answers the fetch
    waiting on it with KAFKA_STORAGE_ERROR, sessionless or in a fetch session, at once rather
    than at the end of its 30 s wait."""
    disk = FailingDisk()
    dirs = [str(tmp_path / "d1"), str(tmp_path / "d2")]
    t = BrokerThread(broker_props(1, new_chroot(zookeeper), tmp_path, **{
        "log.dirs": ",".join(dirs)}), controller_factory=KafkaController)
    t.server.file_io = disk
    t.start()
    zk = KafkaZkClient(t.server.config.get("zookeeper.connect"), session_timeout_ms=6000).start()
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        AdminZkClient(zk).create_topic("held-on-dir", 1, 1)
        wait_until(lambda: (p := t.partition("held-on-dir", 0)) is not None and p.is_leader,
                   what="held-on-dir-0 led")
        failing = t.call(
            lambda: t.server.log_manager.log_dir_of[TopicPartition("held-on-dir", 0)])
        held = [pool.submit(_held_fetch, t.port, "held-on-dir", session)
                for session in (False, True)]
        # Both wait at the broker (a fetch answered before the failure would show nothing).
        wait_until(lambda: t.call(lambda: len(t.server.replica_manager.core.fetch_purgatory))
                   == 1 and t.call(lambda: sum(
                       s.waker is not None
                       for s in t.server.apis.fetch_manager.cache.sessions.values())) == 1,
                   what="both fetches held")
        disk.fail(failing)
        assert log_dir_failure_scenario.produce_once(t.bootstrap, "held-on-dir") is not None
        for f in held:
            took, codes = f.result(60)
            assert codes == [log_dir_failure_scenario.KAFKA_STORAGE_ERROR]
            assert took < 20, took
    finally:
        pool.shutdown()
        zk.close()
        t.stop()
