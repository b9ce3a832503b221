"""A private ZooKeeper for local clusters and tests: Debian's `zookeeper` jars, run by us.

`ZooKeeperServer(data_dir, port=0)` writes its own `zoo.cfg` under `data_dir` (standalone, bound
to 127.0.0.1 only, no admin HTTP server), starts `java ... ZooKeeperServerMain zoo.cfg` as a
background process with its log in `data_dir/zookeeper.log`, and waits (bounded) until the
server serves requests (the `srvr` four-letter word reports its mode; `ruok` answers earlier).
It does not use /etc/zookeeper or zkServer.sh, so several private servers can run side by side.
The same data dir can be stopped and started again; the znodes survive.
`ZooKeeperServer.attach(data_dir)` finds a server that an earlier process started there (pid and
port are recorded in `data_dir/zookeeper.json`) so that a later command can stop it.

Layout of `data_dir`: `zoo.cfg`, `data/` (ZooKeeper's snapshots and transaction logs),
`zookeeper.log`, `zookeeper.json`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

__all__ = [
    "ZooKeeperError",
    "ZooKeeperServer",
    "find_zookeeper_classpath",
    "four_letter_word",
    "pick_free_port",
]

HOST = "127.0.0.1"
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
DEFAULT_JAVA = "/usr/bin/java"
# zookeeper.jar's manifest lists its dependencies; slf4j needs a binding or it logs nothing.
_JAR_DIRS = ("/usr/share/java", "/usr/share/zookeeper", "/usr/share/zookeeper/lib")
_SLF4J_BINDINGS = ("slf4j-simple.jar", "slf4j-log4j12.jar", "slf4j-jdk14.jar")


class ZooKeeperError(RuntimeError):
    """The ZooKeeper process could not be found, started or stopped."""


def _ephemeral_port_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


# Ports this process handed out: a server spawned later binds them, so a second pick must not
# return one of them even though nothing is listening on it yet.
_handed_out: set[int] = set()
_PORT_FLOOR = 10000


def pick_free_port(host: str = HOST) -> int:
    """A port that is free on `host` and stays free until the caller's server binds it.

    The kernel's pick for port 0 comes from the ephemeral range, which every outgoing connection
    also draws from: between releasing the probe and the server binding (a broker or ZooKeeper
    started as a separate process, seconds later), a client's connect could take it
    (EADDRINUSE at startup, seen in CI). So pick below the ephemeral range, where only explicit
    binds land, and never hand out the same port twice in one process.
    """
    low, high = _ephemeral_port_range()
    candidates = range(_PORT_FLOOR, low) if low - _PORT_FLOOR >= 1000 else range(high + 1, 65536)
    rng = random.Random()
    for _ in range(200):
        port = rng.choice(candidates)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise OSError(f"no free port on {host} outside the ephemeral range after 200 tries")


def find_zookeeper_classpath() -> str:
    """The classpath for Debian's ZooKeeper: zookeeper.jar plus an slf4j binding.

    `TIDELOG_ZOOKEEPER_CLASSPATH` overrides the search.
    """
    override = os.environ.get("TIDELOG_ZOOKEEPER_CLASSPATH")
    if override:
        return override
    jar = next(
        (Path(d) / "zookeeper.jar" for d in _JAR_DIRS if (Path(d) / "zookeeper.jar").is_file()),
        None,
    )
    if jar is None:
        raise ZooKeeperError(
            "zookeeper.jar not found in " + ", ".join(_JAR_DIRS)
            + " (install the Debian package 'zookeeper')"
        )
    entries = [str(jar)]
    for name in _SLF4J_BINDINGS:
        binding = Path("/usr/share/java") / name
        if binding.is_file():
            entries.append(str(binding))
            break
    return os.pathsep.join(entries)


def four_letter_word(host: str, port: int, word: str, timeout_s: float = 2.0) -> str:
    """Send a ZooKeeper four-letter word (`ruok`, `srvr`, `mntr`) and return the reply."""
    deadline = time.monotonic() + timeout_s
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(word.encode("ascii"))
        chunks: list[bytes] = []
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # PR_SET_PDEATHSIG: the kernel sends SIGKILL to ZooKeeper when the process that started it
    # exits, so a crashed test run leaves no orphan JVM behind.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)


class ZooKeeperServer:
    """A standalone ZooKeeper process bound to 127.0.0.1, owned by this object."""

    def __init__(
        self,
        data_dir: str | Path,
        port: int = 0,
        *,
        tick_time_ms: int = 500,
        max_session_timeout_ms: int = 60_000,
        heap_mb: int = 256,
        fsync: bool = False,
        die_with_parent: bool = False,
        java: str = DEFAULT_JAVA,
        classpath: str | None = None,
        extra_config: dict[str, str] | None = None,
    ) -> None:
        """
        `port=0` picks a free 127.0.0.1 port at the first start and keeps it for restarts.
        `tick_time_ms` bounds the smallest session timeout (2 ticks): 500 ms allows 1 s
        sessions, which fault tests need. `fsync=False` sets `forceSync=no` (a local cluster
        survives process crashes without it; not power loss). `die_with_parent=True` kills
        the JVM when the starting process exits (test fixtures); a `tidelog cluster up` wants
        the default, a server that outlives the command.
        """
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.tick_time_ms = tick_time_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.heap_mb = heap_mb
        self.fsync = fsync
        self.die_with_parent = die_with_parent
        self.java = java
        self._classpath = classpath
        self.extra_config = dict(extra_config or {})
        self._proc: subprocess.Popen[bytes] | None = None
        self._attached_pid: int | None = None

    # --- paths and addresses ------------------------------------------------------------------

    @property
    def config_path(self) -> Path:
        return self.data_dir / "zoo.cfg"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "zookeeper.log"

    @property
    def state_path(self) -> Path:
        return self.data_dir / "zookeeper.json"

    @property
    def connect_string(self) -> str:
        if not self.port:
            raise ZooKeeperError("the server has no port yet: start() it first")
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        if self._proc is not None:
            return self._proc.pid
        return self._attached_pid

    # --- lifecycle ----------------------------------------------------------------------------

    def is_running(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        if self._attached_pid is not None:
            return _pid_alive(self._attached_pid, self.config_path)
        return False

    def ruok(self, timeout_s: float = 1.0) -> bool:
        """True when the server answers `imok`."""
        if not self.port:
            return False
        try:
            return four_letter_word(HOST, self.port, "ruok", timeout_s) == "imok"
        except OSError:
            return False

    def is_serving(self, timeout_s: float = 1.0) -> bool:
        """True when the server serves client requests.

        `ruok` answers `imok` as soon as the port is bound, before the database is loaded;
        `srvr` says "not currently serving requests" until then.
        """
        if not self.port:
            return False
        try:
            reply = four_letter_word(HOST, self.port, "srvr", timeout_s)
        except OSError:
            return False
        return "Mode: standalone" in reply or "Mode: leader" in reply or "Mode: follower" in reply

    def start(self, timeout_s: float = 30.0) -> None:
        """Start the JVM and wait until it serves requests, at most `timeout_s` seconds."""
        if self.is_running():
            raise ZooKeeperError(f"ZooKeeper is already running (pid {self.pid})")
        auto_port = self.port == 0
        deadline = time.monotonic() + timeout_s
        attempts = 3 if auto_port else 1
        last_error = ""
        for _ in range(attempts):
            if auto_port:
                self.port = pick_free_port()
            self._spawn()
            ok, last_error = self._wait_ready(deadline)
            if ok:
                self._write_state()
                return
            self._terminate(5.0)
            if "Address already in use" not in last_error or time.monotonic() >= deadline:
                break
            # Another process took the port between our pick and the JVM's bind: pick again.
        if auto_port:
            self.port = 0
        raise ZooKeeperError(f"ZooKeeper did not start: {last_error}")

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout_s`; returns the exit status when known."""
        status = self._terminate(timeout_s)
        with contextlib.suppress(FileNotFoundError):
            self.state_path.unlink()
        return status

    def kill(self) -> None:
        """SIGKILL at once (a crash, for fault tests)."""
        pid = self.pid
        if pid is not None and self.is_running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._reap(5.0)

    def restart(self, timeout_s: float = 30.0) -> None:
        self.stop()
        self.start(timeout_s)

    @classmethod
    def attach(cls, data_dir: str | Path) -> ZooKeeperServer:
        """The server an earlier process started in `data_dir` (from `zookeeper.json`)."""
        path = Path(data_dir).resolve() / "zookeeper.json"
        try:
            state = json.loads(path.read_text())
            pid, port = int(state["pid"]), int(state["port"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ZooKeeperError(f"no ZooKeeper state in {path}: {e}") from None
        server = cls(data_dir, port)
        server._attached_pid = pid
        return server

    def __enter__(self) -> ZooKeeperServer:
        if not self.is_running():
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ZooKeeperServer({str(self.data_dir)!r}, port={self.port}, pid={self.pid})"

    # --- internals ----------------------------------------------------------------------------

    def command(self) -> list[str]:
        """The java command line (built here rather than through zkServer.sh)."""
        classpath = self._classpath or find_zookeeper_classpath()
        return [
            self.java,
            f"-Xmx{self.heap_mb}m",
            "-Xms16m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # C1 only: faster start, enough for a test server
            "-Xss512k",
            "-Djava.net.preferIPv4Stack=true",
            "-Djava.awt.headless=true",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-Dzookeeper.snapshot.trust.empty=true",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
            "-cp",
            classpath,
            MAIN_CLASS,
            str(self.config_path),
        ]

    def _write_config(self) -> None:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        lines = {
            "tickTime": str(self.tick_time_ms),
            "dataDir": str(self.data_dir / "data"),
            "clientPort": str(self.port),
            "clientPortAddress": HOST,
            "maxClientCnxns": "0",
            "minSessionTimeout": str(2 * self.tick_time_ms),
            "maxSessionTimeout": str(self.max_session_timeout_ms),
            "admin.enableServer": "false",  # Jetty on :8080 would clash between servers
            "4lw.commands.whitelist": "ruok,srvr,stat,mntr,cons,wchs,dump",
            "forceSync": "yes" if self.fsync else "no",
            "autopurge.snapRetainCount": "3",
            "autopurge.purgeInterval": "1",
        }
        lines.update(self.extra_config)
        text = "# written by tidelog.cluster.zookeeper\n" + "".join(
            f"{k}={v}\n" for k, v in lines.items()
        )
        self.config_path.write_text(text)

    def _spawn(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        cmd = self.command()
        if not Path(cmd[0]).exists():
            raise ZooKeeperError(f"java not found at {cmd[0]}")
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== tidelog: starting ZooKeeper on {HOST}:{self.port} ====\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,  # Ctrl-C in the terminal is not meant for ZooKeeper
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        self._attached_pid = None

    def _wait_ready(self, deadline: float) -> tuple[bool, str]:
        proc = self._proc
        assert proc is not None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False, f"java exited with status {proc.returncode}: {self._log_tail()}"
            if self.is_serving(timeout_s=0.5):
                return True, ""
            time.sleep(0.1)
        return False, f"not serving on {HOST}:{self.port} in time: {self._log_tail()}"

    def _log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        interesting = [ln for ln in text if "ERROR" in ln or "Exception" in ln] or text
        return " | ".join(ln.strip() for ln in interesting[-lines:])

    def _write_state(self) -> None:
        state = {"pid": self.pid, "port": self.port, "connect_string": self.connect_string}
        self.state_path.write_text(json.dumps(state) + "\n")

    def _terminate(self, timeout_s: float) -> int | None:
        pid = self.pid
        if pid is None:
            return None
        if self.is_running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            status = self._reap(timeout_s)
            if self.is_running():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                status = self._reap(5.0)
            return status
        return self._reap(0.0)

    def _reap(self, timeout_s: float) -> int | None:
        if self._proc is not None:
            try:
                return self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return None
        if self._attached_pid is not None:
            deadline = time.monotonic() + timeout_s
            while _pid_alive(self._attached_pid, self.config_path):
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.05)
        return None


def _pid_alive(pid: int, config_path: Path) -> bool:
    """True when `pid` runs and is the ZooKeeper of `config_path` (never a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":  # a zombie has exited
        return False
    return str(config_path).encode() in cmdline

