"""A test fixture's cluster (`LocalCluster(d, die_with_parent=True)`, as tests/compat uses) must
not outlive the process that started it, even when that process is killed -9: ZooKeeper and
every broker get SIGKILL from the kernel (PR_SET_PDEATHSIG), as the Kafka launcher's JVMs do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]

STARTER = """
import json, sys, time
from tidelog.cluster.local import LocalCluster
c = LocalCluster(sys.argv[1], die_with_parent=True)
c.up(1, timeout_s=120)
print(json.dumps([c.zookeeper_pid] + [b.pid for b in c.brokers.values()]), flush=True)
time.sleep(600)  # killed by the test long before
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not yet reaped by init) has exited too.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_zookeeper_and_brokers_die_when_their_starter_is_killed(tmp_path: Path) -> None:
    errors = tmp_path / "starter.err"
    with errors.open("w") as err:
        starter = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path / "c")],
                                   stdout=subprocess.PIPE, stderr=err, text=True)
    pids: list[int] = []
    try:
        assert starter.stdout is not None
        line = starter.stdout.readline()  # bounded by up()'s own timeout
        assert line, f"the cluster did not start: {errors.read_text()[-2000:]}"
        pids = json.loads(line)
        assert len(pids) == 2 and all(_alive(p) for p in pids), line
        starter.kill()  # SIGKILL: no finally, no atexit runs in the starter
        starter.wait(timeout=10)
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)], "outlived the process that started them"
    finally:
        starter.kill()
        for pid in pids:  # backstop on a failure, by PID
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
