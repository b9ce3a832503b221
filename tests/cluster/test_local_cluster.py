"""`tidelog cluster ...`: a local cluster of real processes (ZooKeeper + brokers), driven
through the command line as a user would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.cluster.local import LocalCluster, _pid_runs

TIDELOG = [sys.executable, "-m", "tidelog"]


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TIDELOG, *args], capture_output=True, text=True, timeout=timeout)


def test_status_without_a_cluster_is_a_clear_error(tmp_path: Path) -> None:
    r = run("cluster", "status", "--dir", str(tmp_path / "none"))
    assert r.returncode == 1
    assert "no cluster in" in r.stderr and "Traceback" not in r.stderr


def test_bad_override_is_refused_before_anything_starts(tmp_path: Path) -> None:
    d = tmp_path / "c"
    r = run("cluster", "up", "--dir", str(d), "--brokers", "1", "--override", "no.such.key=1")
    assert r.returncode == 1
    assert "no.such.key" in r.stderr and "Traceback" not in r.stderr
    assert not (d / "cluster.json").exists()
    assert not (d / "zookeeper" / "zookeeper.json").exists()
    r = run("cluster", "up", "--dir", str(d), "--override", "novalue")
    assert r.returncode == 1 and "key=value" in r.stderr


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "cluster"
    try:
        yield d
    finally:
        if (d / "cluster.json").exists():
            c = LocalCluster.load(d)
            c.down(timeout_s=10)
            for b in c.brokers.values():  # backstop: by PID, only if still that broker
                if _pid_runs(b.pid, b.config):
                    os.kill(b.pid, signal.SIGKILL)  # type: ignore[arg-type]


def test_broker_that_cannot_start_fails_up_and_leaves_nothing_running(cluster_dir: Path) -> None:
    d = cluster_dir
    # Brokers pointed at a ZooKeeper that does not exist exit at startup.
    r = run("cluster", "up", "--dir", str(d), "--brokers", "1", "--timeout", "60",
            "--override", "zookeeper.connect=127.0.0.1:1",
            "--override", "zookeeper.connection.timeout.ms=1000")
    assert r.returncode == 1, r.stdout
    assert "broker 1" in r.stderr and "Traceback" not in r.stderr.splitlines()[-1]
    state = json.loads((d / "cluster.json").read_text())
    pids = [b["pid"] for b in state["brokers"]] + [state["zookeeper_pid"]]
    deadline = time.monotonic() + 15
    while any(_pid_runs(p, str(d)) for p in pids):
        assert time.monotonic() < deadline, "processes left running"
        time.sleep(0.1)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_up_status_kill_start_down(cluster_dir: Path) -> None:
    d = str(cluster_dir)
    # A short session: start-broker after --kill waits for the killed one's to expire.
    r = run("cluster", "up", "--dir", d, "--brokers", "2",
            "--override", "zookeeper.session.timeout.ms=2500")
    assert r.returncode == 0, r.stderr
    state = json.loads((cluster_dir / "cluster.json").read_text())
    last = r.stdout.strip().splitlines()[-1]
    assert last == state["bootstrap_servers"]
    assert [b["id"] for b in state["brokers"]] == [1, 2]
    assert last == ",".join(f"127.0.0.1:{b['port']}" for b in state["brokers"])
    for b in state["brokers"]:
        assert Path(b["log_file"]).exists() and Path(b["config"]).exists()

    c = LocalCluster.load(cluster_dir)
    st = c.status()
    assert all(s.alive and s.registered for s in st)
    assert sum(s.controller for s in st) == 1

    r = run("cluster", "stop-broker", "--dir", d, "--broker", "2", "--kill")
    assert r.returncode == 0 and "killed" in r.stdout
    assert not c.alive(2)
    r = run("cluster", "status", "--dir", d)
    assert r.returncode == 0
    assert c.status()[1].alive is False

    r = run("cluster", "start-broker", "--dir", d, "--broker", "2")
    assert r.returncode == 0, r.stderr
    c = LocalCluster.load(cluster_dir)
    assert c.brokers[2].pid != state["brokers"][1]["pid"]
    assert c.status()[1].registered

    r = run("cluster", "stop-broker", "--dir", d, "--broker", "1")  # SIGTERM: controlled
    assert r.returncode == 0 and "stopped" in r.stdout, r.stdout + r.stderr

    r = run("cluster", "down", "--dir", d)
    assert r.returncode == 0
    for b in c.brokers.values():
        assert not _pid_runs(b.pid, b.config)
    assert not _pid_runs(c.zookeeper_pid, str(cluster_dir / "zookeeper"))

    # The same directory comes up again (its ZooKeeper data and logs are kept) ...
    r = run("cluster", "up", "--dir", d, "--brokers", "2")
    assert r.returncode == 0, r.stderr
    again = LocalCluster.load(cluster_dir)
    assert all(s.alive and s.registered for s in again.status())
    # ... but not twice.
    r = run("cluster", "up", "--dir", d, "--brokers", "2")
    assert r.returncode == 1 and "already running" in r.stderr
    assert run("cluster", "down", "--dir", d).returncode == 0
