"""`tidelog demo` end to end on real processes: a 3-broker cluster loses the leader of
partition 0 to kill -9 under an acks=all stream, fails over, takes the broker back, and every
acknowledged record is consumed back once; the demo stops every process it started, also when
it is interrupted."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidelog.cli.demo import on_disk_log_end_offset
from tidelog.cli.main import cli
from tidelog.cluster.local import _pid_runs

TIDELOG = [sys.executable, "-m", "tidelog"]
ENV = {**os.environ, "COLUMNS": "140", "NO_COLOR": "1"}


def still_running(demo_dir: Path) -> list[str]:
    """The brokers and the ZooKeeper recorded by the demo that still run."""
    state = json.loads((demo_dir / "cluster" / "cluster.json").read_text())
    out = [f"broker {b['id']} (pid {b['pid']})" for b in state["brokers"]
           if _pid_runs(b["pid"], b["config"])]
    zk_pid = state["zookeeper_pid"]
    try:  # a recycled pid would not name the demo's dir on its command line
        if str(demo_dir).encode() in Path(f"/proc/{zk_pid}/cmdline").read_bytes():
            out.append(f"ZooKeeper (pid {zk_pid})")
    except OSError:
        pass
    return out


def assert_all_stopped(demo_dir: Path) -> None:
    deadline = time.monotonic() + 10
    while alive := still_running(demo_dir):
        assert time.monotonic() < deadline, f"still running after the demo: {alive}"
        time.sleep(0.2)


@pytest.mark.integration
@pytest.mark.timeout(170)
def test_demo_kills_the_leader_fails_over_rejoins_and_loses_nothing(tmp_path: Path) -> None:
    demo_dir = tmp_path / "demo"
    r = subprocess.run(
        [*TIDELOG, "demo", "--dir", str(demo_dir), "--records", "1800", "--rate", "150",
         "--partitions", "3", "--lag-ms", "2000"],
        capture_output=True, text=True, timeout=160, env=ENV)
    out = r.stdout
    assert r.returncode == 0, f"demo failed ({r.returncode}):\n{out}\n{r.stderr}"

    victim = int(re.search(r"kill -9 broker (\d+), the leader of demo-0", out).group(1))
    new_leader = re.search(
        rf"demo-0: leader {victim} -> (\d+), leader epoch (\d+) -> (\d+)", out)
    assert new_leader, out
    assert int(new_leader.group(1)) != victim
    assert int(new_leader.group(3)) > int(new_leader.group(2))
    # the ISR shrank without the dead broker and grew back with it
    assert re.search(rf"ISR \[[\d,]*{victim}[\d,]*\] -> \[[\d,]+\]", out), out
    assert re.search(rf"broker {victim} started", out), out
    assert f"broker {victim} is back in every ISR" in out

    cell = r"\s*[│|]\s*([\d,]+)"  # rich draws ASCII boxes when the encoding is not UTF-8
    total = re.search(r"total" + cell * 6, out)
    assert total, out
    sent, acked, _failed, consumed, missing, duplicates = (
        int(g.replace(",", "")) for g in total.groups())
    assert sent == 1800 and acked > 0
    assert consumed >= acked
    assert missing == 0 and duplicates == 0
    assert re.search(r"acked (⊆|subset of) consumed and no duplicates: holds", out), out
    assert_all_stopped(demo_dir)


@pytest.mark.integration
@pytest.mark.timeout(170)
def test_demo_interrupted_stops_the_cluster_it_started(tmp_path: Path) -> None:
    demo_dir = tmp_path / "demo"
    proc = subprocess.Popen(
        [*TIDELOG, "demo", "--dir", str(demo_dir), "--records", "100000", "--rate", "100"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:  # bounded by the test timeout
            lines.append(line)
            if "a steady stream" in line:
                break
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, "".join(lines) + rest
    assert "cluster down" in rest
    assert_all_stopped(demo_dir)


def test_demo_refuses_to_wipe_a_dir_that_is_not_its_own(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep-me.txt").write_text("data")
    r = subprocess.run([*TIDELOG, "demo", "--dir", str(precious)], capture_output=True,
                       text=True, timeout=60, env=ENV)
    assert r.returncode == 1
    assert "refusing to wipe" in r.stderr
    assert (precious / "keep-me.txt").read_text() == "data"


def test_demo_storage_only_walks_through_a_partition_log(tmp_path: Path) -> None:
    demo_dir = tmp_path / "storage"
    r = subprocess.run([*TIDELOG, "demo", "--storage-only", "--dir", str(demo_dir),
                        "--count", "500"], capture_output=True, text=True, timeout=60, env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "demo finished" in r.stdout
    assert any((demo_dir / "logs" / "demo-0").glob("*.log"))


def test_on_disk_log_end_offset_reads_the_segments_without_opening_the_log(
        tmp_path: Path) -> None:
    from click.testing import CliRunner

    log_dir = tmp_path / "logs"
    r = CliRunner().invoke(cli, ["log", "write", str(log_dir), "--topic", "demo", "--partition",
                                 "0", "--count", "1234", "--batch", "100"])
    assert r.exit_code == 0, r.output
    partition_dir = log_dir / "demo-0"
    assert on_disk_log_end_offset(partition_dir) == 1234
    segment = max(partition_dir.glob("*.log"), key=lambda p: int(p.stem))
    whole = segment.read_bytes()
    with segment.open("ab") as f:  # a torn batch at the tail, as a kill -9 can leave
        f.write(whole[:40])
    assert on_disk_log_end_offset(partition_dir) == 1234
    assert on_disk_log_end_offset(tmp_path / "no-such-partition") is None
