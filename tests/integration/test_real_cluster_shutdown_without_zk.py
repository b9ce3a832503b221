"""Stopping always works (issue 11 item 4): a broker sent SIGTERM while ZooKeeper is unreachable
still exits. Controlled shutdown is tried as Kafka tries it (controlled.shutdown.max.retries
attempts, controlled.shutdown.retry.backoff.ms apart), then the broker shuts down locally and
cleanly: checkpoints written, the clean-shutdown marker in its log dir."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from real_cluster_harness import produce_acked, producer, tidelog, wait_for

from tidelog.cluster.local import LocalCluster, _pid_runs
from tidelog.storage.log_manager import CLEAN_SHUTDOWN_FILE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SETTINGS = {
    "zookeeper.session.timeout.ms": "6000",
    "controlled.shutdown.max.retries": "2",
    "controlled.shutdown.retry.backoff.ms": "500",
    "controller.socket.timeout.ms": "3000",
    "default.replication.factor": "2",
    "min.insync.replicas": "1",
}
# Bound on the exit: 2 attempts, each at most a ZooKeeper wait, a connection and one
# controller.socket.timeout.ms, plus the backoff and the local shutdown.
EXIT_WITHIN_S = 45


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    overrides = [a for k, v in SETTINGS.items() for a in ("--override", f"{k}={v}")]
    tidelog("cluster", "up", "--dir", str(tmp_path), "--brokers", "2", *overrides)
    c = LocalCluster.load(tmp_path)
    try:
        yield c
    finally:
        c = LocalCluster.load(tmp_path)
        for b in c.brokers.values():  # by PID, only if still that broker
            if _pid_runs(b.pid, b.config):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(b.pid, signal.SIGKILL)  # type: ignore[arg-type]
        c.down(timeout_s=10)


def test_sigterm_exits_cleanly_while_zookeeper_is_unreachable(cluster: LocalCluster) -> None:
    topic = "zkdown"
    tidelog("topics", "create", "--bootstrap-server", cluster.bootstrap_servers, "--topic", topic,
            "--partitions", "2", "--replication-factor", "2")
    assert len(produce_acked(producer(cluster.bootstrap_servers), topic,
                             [(b"k%d" % i, b"v") for i in range(20)])) == 20
    broker = cluster.brokers[max(cluster.brokers)]
    marker = Path(broker.log_dir) / CLEAN_SHUTDOWN_FILE
    assert not marker.exists()  # a running broker has none

    assert cluster.zookeeper_pid is not None
    os.kill(cluster.zookeeper_pid, signal.SIGKILL)  # ZooKeeper gone: connections refused
    wait_for(lambda: not _alive(cluster.zookeeper_pid), 10, what="ZooKeeper dead")

    started = time.monotonic()
    assert broker.pid is not None
    os.kill(broker.pid, signal.SIGTERM)
    exited = wait_for(lambda: not cluster.alive(broker.id), EXIT_WITHIN_S + 15,
                      what="the broker to exit after SIGTERM with ZooKeeper down")
    took = time.monotonic() - started
    assert exited and took < EXIT_WITHIN_S, f"took {took:.1f} s"
    assert marker.exists(), cluster.log_tail(broker.id, 10)
    log = Path(broker.log_file).read_text(errors="replace")
    assert "controlled shutdown" in log and f"broker {broker.id} shut down" in log, log[-3000:]
    for name in ("replication-offset-checkpoint", "recovery-point-offset-checkpoint"):
        assert (Path(broker.log_dir) / name).exists(), name


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of another process still answers kill(0): look at its state
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    return False
