"""A tidelog LocalCluster for a compat fixture: up with its brokers' metadata served, and at the
end down, then, as a backstop, SIGKILL by PID for any broker process still running it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tidelog.cluster.local import LocalCluster, _pid_runs
from tidelog.testing.kafka_cluster import wait_for_metadata

__all__ = ["running_local_cluster"]


@contextmanager
def running_local_cluster(
        base: Path, brokers: int, overrides: Mapping[str, str],
        broker_overrides: Callable[[int, int], Mapping[str, str]] | None = None
) -> Iterator[LocalCluster]:
    """``broker_overrides(broker_id, client_port)``: settings of one broker (LocalCluster.up)."""
    cluster = LocalCluster(base, die_with_parent=True)  # gone with pytest, even on kill -9
    try:
        cluster.up(brokers, overrides=overrides, timeout_s=120, broker_overrides=broker_overrides)
        wait_for_metadata([b.address for b in cluster.brokers.values()], brokers,
                          time.monotonic() + 60)
        yield cluster
    finally:
        cluster.down(timeout_s=15)
        for b in cluster.brokers.values():  # only if that PID still runs this broker
            if _pid_runs(b.pid, b.config):
                os.kill(b.pid, signal.SIGKILL)  # type: ignore[arg-type]
