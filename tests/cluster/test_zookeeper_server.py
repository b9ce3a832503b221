from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tidelog.cluster.zookeeper import (
    ZooKeeperError,
    ZooKeeperServer,
    four_letter_word,
)

pytestmark = pytest.mark.integration


def _kazoo(connect: str) -> KazooClient:
    client = KazooClient(hosts=connect, timeout=10.0)
    client.start(timeout=15)
    return client


def _pid_exists(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def test_session_fixture_answers_ruok_and_is_bound_to_loopback(zookeeper: ZooKeeperServer) -> None:
    host, port = zookeeper.connect_string.split(":")
    assert host == "127.0.0.1"
    assert four_letter_word(host, int(port), "ruok") == "imok"
    assert "Mode: standalone" in four_letter_word(host, int(port), "srvr")
    cfg = zookeeper.config_path.read_text()
    assert "clientPortAddress=127.0.0.1" in cfg
    assert "admin.enableServer=false" in cfg


def test_start_stop_restart_keeps_port_and_znodes(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path / "zk", die_with_parent=True)
    server.start(timeout_s=60)
    try:
        first_pid, port = server.pid, server.port
        assert first_pid is not None and port > 0
        assert server.is_running() and server.ruok()
        client = _kazoo(server.connect_string)
        client.create("/survives", b"yes", makepath=True)
        client.stop()
        client.close()

        status = server.stop()
        assert status is not None  # reaped: it exited within the bound
        assert not server.is_running()
        assert not _pid_exists(first_pid)
        assert not server.ruok()

        server.start(timeout_s=60)
        assert server.port == port
        assert server.pid != first_pid
        client = _kazoo(server.connect_string)
        data, _ = client.get("/survives")
        client.stop()
        client.close()
        assert data == b"yes"
        assert (tmp_path / "zk" / "zookeeper.log").stat().st_size > 0
    finally:
        server.stop()


def test_attach_finds_and_stops_a_server_started_elsewhere(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path / "zk", die_with_parent=True)
    server.start(timeout_s=60)
    try:
        other = ZooKeeperServer.attach(tmp_path / "zk")
        assert other.pid == server.pid
        assert other.connect_string == server.connect_string
        assert other.is_running()
        other.stop()
        assert not other.is_running()
        assert not (tmp_path / "zk" / "zookeeper.json").exists()
    finally:
        server.stop()
    with pytest.raises(ZooKeeperError, match="no ZooKeeper state"):
        ZooKeeperServer.attach(tmp_path / "zk")


def test_kill_is_immediate_and_the_data_dir_restarts(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path / "zk", die_with_parent=True)
    server.start(timeout_s=60)
    try:
        client = _kazoo(server.connect_string)
        client.create("/before-kill", b"1")
        client.stop()
        client.close()
        pid = server.pid
        assert pid is not None
        server.kill()
        assert not _pid_exists(pid)
        server.start(timeout_s=60)
        client = _kazoo(server.connect_string)
        assert client.exists("/before-kill") is not None
        client.stop()
        client.close()
    finally:
        server.stop()


def test_double_start_is_refused(zookeeper: ZooKeeperServer) -> None:
    with pytest.raises(ZooKeeperError, match="already running"):
        zookeeper.start()


def test_a_taken_fixed_port_fails_with_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        server = ZooKeeperServer(tmp_path / "zk", port, die_with_parent=True)
        with pytest.raises(ZooKeeperError, match="did not start"):
            server.start(timeout_s=20)
        assert not server.is_running()


def test_missing_java_is_a_clear_error(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path / "zk", java=str(tmp_path / "no-java"))
    with pytest.raises(ZooKeeperError, match="java not found"):
        server.start(timeout_s=5)
    assert server.pid is None or not _pid_exists(server.pid)


def test_command_line_is_built_without_etc_zookeeper(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path / "zk", 2181, heap_mb=128)
    cmd = server.command()
    assert cmd[0] == "/usr/bin/java"
    assert "-Xmx128m" in cmd
    assert cmd[-2:] == ["org.apache.zookeeper.server.ZooKeeperServerMain", str(server.config_path)]
    assert not any("/etc/zookeeper" in part for part in cmd)
    assert os.path.isfile(cmd[cmd.index("-cp") + 1].split(":")[0])
