"""A local tidelog cluster: a private ZooKeeper and N broker processes on 127.0.0.1.

`LocalCluster(D).up(brokers=3)` starts ZooKeeper (`D/zookeeper/`) and brokers
(`python -m tidelog server D/broker-N/server.properties`, log in `D/broker-N/server.log`,
data in `D/broker-N/data`) as background processes in their own sessions, so they outlive the
command that started them; it waits (bounded) until every broker is registered in ZooKeeper
and a controller is elected, then records everything in `D/cluster.json`:

    {"dir": D, "bootstrap_servers": "127.0.0.1:p1,...", "zookeeper": "127.0.0.1:zp",
     "zookeeper_pid": pid, "overrides": {...},
     "brokers": [{"id": 1, "port": p1, "pid": pid, "log_dir": ".../data",
                  "config": ".../server.properties", "log_file": ".../server.log"}, ...]}

Later commands (`LocalCluster.load(D)`) stop, kill and restart brokers and stop everything by
the PIDs recorded there, checking each PID still runs *that* broker (its command line names its
server.properties) before signalling it: a recycled PID is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tidelog.cluster.zookeeper import HOST, ZooKeeperServer, _die_with_parent, pick_free_port

__all__ = ["BrokerProcess", "ClusterError", "LocalCluster"]

CLUSTER_FILE = "cluster.json"
Progress = Callable[[str], None]


class ClusterError(RuntimeError):
    """A local cluster could not be started, found or stopped."""


@dataclass
class BrokerProcess:
    id: int
    port: int
    pid: int | None
    log_dir: str
    config: str
    log_file: str

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"


@dataclass
class BrokerStatus:
    id: int
    port: int
    pid: int | None
    alive: bool
    registered: bool | None  # None when ZooKeeper could not be asked
    controller: bool


def _pid_runs(pid: int | None, marker: str) -> bool:
    """True when `pid` is a live (non-zombie) process whose command line contains `marker`."""
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
        return False
    return marker.encode() in cmdline


def _no_progress(_msg: str) -> None:
    pass


class LocalCluster:
    """The processes of one local cluster, as recorded in `D/cluster.json`."""

    def __init__(self, directory: str | Path, die_with_parent: bool = False) -> None:
        self.dir = Path(directory).resolve()
        # For test fixtures: ZooKeeper and every broker get SIGKILL when the process that
        # started them dies (PR_SET_PDEATHSIG), even by kill -9. `cluster up` leaves it off.
        self.die_with_parent = die_with_parent
        self.brokers: dict[int, BrokerProcess] = {}
        self.zookeeper = ""
        self.zookeeper_pid: int | None = None
        self.overrides: dict[str, str] = {}
        self._procs: dict[int, subprocess.Popen[bytes]] = {}

    # -- persistence -------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.dir / CLUSTER_FILE

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(b.address for _, b in sorted(self.brokers.items()))

    @classmethod
    def load(cls, directory: str | Path) -> LocalCluster:
        c = cls(directory)
        try:
            state = json.loads(c.state_path.read_text())
        except FileNotFoundError:
            raise ClusterError(f"no cluster in {c.dir} (no {CLUSTER_FILE}); run `tidelog cluster up`"
                               ) from None
        except (OSError, ValueError) as e:
            raise ClusterError(f"unreadable {c.state_path}: {e}") from None
        try:
            c.zookeeper = state["zookeeper"]
            c.zookeeper_pid = state.get("zookeeper_pid")
            c.overrides = dict(state.get("overrides") or {})
            for b in state["brokers"]:
                c.brokers[int(b["id"])] = BrokerProcess(
                    int(b["id"]), int(b["port"]), b.get("pid"), b["log_dir"], b["config"],
                    b["log_file"])
        except (KeyError, TypeError, ValueError) as e:
            raise ClusterError(f"{c.state_path} is not a tidelog cluster file ({e!r})") from None
        return c

    def save(self) -> None:
        state = {
            "dir": str(self.dir),
            "bootstrap_servers": self.bootstrap_servers,
            "zookeeper": self.zookeeper,
            "zookeeper_pid": self.zookeeper_pid,
            "overrides": self.overrides,
            "brokers": [asdict(b) for _, b in sorted(self.brokers.items())],
        }
        tmp = self.state_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.state_path)

    # -- up ------------------------------------------------------------------------------------
    def broker_properties(self, broker_id: int, port: int, n_brokers: int,
                          zookeeper: str | None = None) -> dict[str, str]:
        """A broker's server.properties: local defaults, then the `--override`s."""
        props = {
            "broker.id": str(broker_id),
            "listeners": f"PLAINTEXT://{HOST}:{port}",
            "log.dirs": str(self.dir / f"broker-{broker_id}" / "data"),
            "zookeeper.connect": zookeeper or self.zookeeper,
            # A killed broker's session must expire soon for a quick failover in local use.
            "zookeeper.session.timeout.ms": "6000",
            "offsets.topic.replication.factor": str(min(3, n_brokers)),
            "transaction.state.log.replication.factor": str(min(3, n_brokers)),
            "transaction.state.log.min.isr": str(min(2, n_brokers)),
            "group.initial.rebalance.delay.ms": "0",
        }
        props.update(self.overrides)
        return props

    def up(
        self,
        n_brokers: int = 3,
        overrides: Mapping[str, str] | None = None,
        timeout_s: float = 90.0,
        progress: Progress = _no_progress,
        broker_overrides: Callable[[int, int], Mapping[str, str]] | None = None,
    ) -> None:
        """Start ZooKeeper and `n_brokers` brokers; wait until all are registered and a
        controller is elected. On failure everything started here is stopped again.

        `broker_overrides(broker_id, client_port)` may add settings of one broker (extra
        listeners, say); `client_port` is the PLAINTEXT port chosen for it."""
        if n_brokers < 1:
            raise ClusterError("--brokers must be at least 1")
        if self.state_path.exists():
            try:
                old = LocalCluster.load(self.dir)
            except ClusterError:
                old = None
            if old is not None and (any(s.alive for s in old.status(ask_zookeeper=False))
                                    or old._zookeeper_running()):
                raise ClusterError(f"a cluster is already running in {self.dir}; "
                                   "`tidelog cluster down` first")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.overrides = dict(overrides or {})
        self._check_config(n_brokers)
        deadline = time.monotonic() + timeout_s
        progress(f"starting ZooKeeper in {self.dir / 'zookeeper'}")
        zk = ZooKeeperServer(self.dir / "zookeeper", die_with_parent=self.die_with_parent)
        try:
            zk.start(timeout_s=max(5.0, min(60.0, deadline - time.monotonic())))
        except Exception as e:
            raise ClusterError(f"ZooKeeper did not start: {e}") from None
        self.zookeeper = zk.connect_string
        self.zookeeper_pid = zk.pid
        try:
            for broker_id in range(1, n_brokers + 1):
                port = pick_free_port()
                bdir = self.dir / f"broker-{broker_id}"
                bdir.mkdir(parents=True, exist_ok=True)
                cfg = bdir / "server.properties"
                props = self.broker_properties(broker_id, port, n_brokers)
                if broker_overrides is not None:
                    props.update(broker_overrides(broker_id, port))
                cfg.write_text("# written by tidelog cluster up\n"
                               + "".join(f"{k}={v}\n" for k, v in props.items()))
                self.brokers[broker_id] = BrokerProcess(
                    broker_id, port, None, props["log.dirs"], str(cfg), str(bdir / "server.log"))
                self._spawn(broker_id)
                progress(f"started broker {broker_id} on {HOST}:{port} "
                         f"(pid {self.brokers[broker_id].pid})")
            self.save()
            self.wait_until_ready(list(self.brokers), deadline, progress)
            self.save()
        except BaseException:
            self.down(progress=_no_progress)
            raise

    def _check_config(self, n_brokers: int) -> None:
        from tidelog.broker.config import ConfigError, KafkaConfig

        try:
            KafkaConfig(self.broker_properties(1, 9092, n_brokers, zookeeper=f"{HOST}:2181"))
        except ConfigError as e:
            raise ClusterError(f"invalid --override: {e}") from None

    def _spawn(self, broker_id: int) -> None:
        b = self.brokers[broker_id]
        with open(b.log_file, "ab") as log:
            log.write(f"\n==== tidelog cluster: starting broker {broker_id} ====\n".encode())
            log.flush()
            proc = subprocess.Popen(
                [sys.executable, "-m", "tidelog", "server", b.config],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(self.dir),
                start_new_session=True,  # outlives `cluster up`; Ctrl-C is not meant for it
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        self._procs[broker_id] = proc
        b.pid = proc.pid

    def _zk_client(self) -> Any:
        from tidelog.controller.zk_client import KafkaZkClient

        return KafkaZkClient(self.zookeeper, session_timeout_ms=6000,
                             connection_timeout_ms=3000).start(create_top_level_paths=False)

    def wait_until_ready(self, broker_ids: Sequence[int], deadline: float,
                         progress: Progress = _no_progress,
                         stale_epochs: Mapping[int, int] | None = None) -> None:
        """Until `broker_ids` are registered and a controller is elected; a broker process that
        exits meanwhile fails at once with its log's tail. A registration whose broker epoch is
        in `stale_epochs` is the previous (killed) process's, whose ZooKeeper session has not
        expired yet: it does not count."""
        want = set(broker_ids)
        stale = dict(stale_epochs or {})
        last = ""
        zk = None
        try:
            while True:
                for bid in sorted(want):
                    if not self.alive(bid):
                        raise ClusterError(f"broker {bid} exited during startup: "
                                           f"{self.log_tail(bid)}")
                registered: set[int] = set()
                controller = None
                try:
                    if zk is None:
                        zk = self._zk_client()
                    registered = set(zk.get_all_broker_ids())
                    for bid in sorted(registered & set(stale)):
                        found = zk.get_broker(bid)
                        if found is None or found[1] == stale[bid]:
                            registered.discard(bid)
                    controller = zk.get_controller_id()
                except Exception:  # noqa: BLE001 - ZooKeeper still coming up
                    registered = set()
                ready = want <= registered and controller is not None
                msg = (f"{len(want & registered)}/{len(want)} brokers registered, controller: "
                       f"{controller if controller is not None else 'none yet'}")
                if msg != last:
                    progress(msg)
                    last = msg
                if ready:
                    return
                if time.monotonic() >= deadline:
                    missing = sorted(want - registered)
                    tails = "; ".join(f"broker {b}: {self.log_tail(b)}" for b in missing)
                    raise ClusterError(f"timed out: {msg}" + (f" ({tails})" if tails else ""))
                time.sleep(0.2)
        finally:
            if zk is not None:
                zk.close()

    # -- processes --------------------------------------------------------------------------------
    def alive(self, broker_id: int) -> bool:
        b = self.brokers[broker_id]
        proc = self._procs.get(broker_id)
        if proc is not None and proc.pid == b.pid:
            return proc.poll() is None
        return _pid_runs(b.pid, b.config)

    def log_tail(self, broker_id: int, lines: int = 3) -> str:
        try:
            text = Path(self.brokers[broker_id].log_file).read_text(errors="replace")
        except OSError:
            return "(no log)"
        rows = [r.strip() for r in text.strip().splitlines() if r.strip()]
        return " | ".join(rows[-lines:]) or "(empty log)"

    def _wait_exit(self, broker_id: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.alive(broker_id):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def stop_broker(self, broker_id: int, kill: bool = False, timeout_s: float = 60.0) -> str:
        """SIGTERM (a controlled shutdown) or, with `kill`, SIGKILL; waits for the exit.

        A broker that does not exit within `timeout_s` after SIGTERM is killed. Returns what
        happened, for the tool's output."""
        b = self._broker(broker_id)
        if not self.alive(broker_id):
            return f"broker {broker_id} is not running"
        assert b.pid is not None
        os.kill(b.pid, signal.SIGKILL if kill else signal.SIGTERM)
        if kill:
            self._wait_exit(broker_id, 10.0)
            return f"broker {broker_id} killed (SIGKILL, pid {b.pid})"
        if self._wait_exit(broker_id, timeout_s):
            return f"broker {broker_id} stopped (pid {b.pid})"
        with contextlib.suppress(ProcessLookupError):
            os.kill(b.pid, signal.SIGKILL)
        self._wait_exit(broker_id, 10.0)
        return f"broker {broker_id} did not stop within {timeout_s:g} s: killed (pid {b.pid})"

    def start_broker(self, broker_id: int, timeout_s: float = 60.0,
                     progress: Progress = _no_progress) -> str:
        """Start a stopped broker again (same port, config and data); waits until registered."""
        self._broker(broker_id)
        if self.alive(broker_id):
            return f"broker {broker_id} is already running (pid {self.brokers[broker_id].pid})"
        deadline = time.monotonic() + timeout_s
        stale = self._wait_previous_session_gone(broker_id, deadline, progress)
        self._spawn(broker_id)
        self.save()
        self.wait_until_ready([broker_id], deadline, progress, stale)
        return f"broker {broker_id} started (pid {self.brokers[broker_id].pid})"

    def _wait_previous_session_gone(self, broker_id: int, deadline: float,
                                    progress: Progress) -> dict[int, int]:
        """A killed broker's registration lives until its ZooKeeper session expires, and a new
        process could not register meanwhile (Kafka refuses it too): wait for it to go.
        Returns {broker: stale epoch} if it is still there at the deadline."""
        zk = None
        try:
            zk = self._zk_client()
            found = zk.get_broker(broker_id)
            if found is None:
                return {}
            progress(f"waiting for broker {broker_id}'s previous ZooKeeper session to expire")
            while time.monotonic() < deadline:
                again = zk.get_broker(broker_id)
                if again is None or again[1] != found[1]:
                    return {}
                time.sleep(0.2)
            return {broker_id: found[1]}
        except Exception:  # noqa: BLE001 - ZooKeeper unreachable: the wait after spawn reports it
            return {}
        finally:
            if zk is not None:
                zk.close()

    def _broker(self, broker_id: int) -> BrokerProcess:
        b = self.brokers.get(broker_id)
        if b is None:
            raise ClusterError(f"no broker {broker_id} in this cluster "
                               f"(brokers: {', '.join(map(str, sorted(self.brokers)))})")
        return b

    def _zookeeper_running(self) -> bool:
        try:
            return self._zookeeper_server().is_running()
        except Exception:  # noqa: BLE001 - no zookeeper.json: not started by us
            return False

    def _zookeeper_server(self) -> ZooKeeperServer:
        return ZooKeeperServer.attach(self.dir / "zookeeper")

    def down(self, timeout_s: float = 30.0, progress: Progress = _no_progress) -> None:
        """Stop every broker (SIGTERM, SIGKILL after `timeout_s`), then ZooKeeper."""
        running = [bid for bid in sorted(self.brokers) if self.alive(bid)]
        for bid in running:
            pid = self.brokers[bid].pid
            assert pid is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for bid in running:
            if not self._wait_exit(bid, max(0.0, deadline - time.monotonic())):
                pid = self.brokers[bid].pid
                assert pid is not None
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._wait_exit(bid, 10.0)
                progress(f"broker {bid} killed (did not stop in time)")
            else:
                progress(f"broker {bid} stopped")
        zk_dir = self.dir / "zookeeper"
        if (zk_dir / "zookeeper.json").exists():
            with contextlib.suppress(Exception):
                zk = self._zookeeper_server()
                if zk.is_running():
                    zk.stop()
                    progress("ZooKeeper stopped")
        for proc in self._procs.values():
            with contextlib.suppress(Exception):
                proc.wait(timeout=1)

    # -- status ----------------------------------------------------------------------------------
    def status(self, ask_zookeeper: bool = True) -> list[BrokerStatus]:
        registered: set[int] | None = None
        controller: int | None = None
        if ask_zookeeper and self.zookeeper and self._zookeeper_running():
            zk = None
            try:
                zk = self._zk_client()
                registered = set(zk.get_all_broker_ids())
                controller = zk.get_controller_id()
            except Exception:  # noqa: BLE001 - ZooKeeper down: report what the PIDs say
                registered = None
            finally:
                if zk is not None:
                    zk.close()
        return [
            BrokerStatus(bid, b.port, b.pid, self.alive(bid),
                         None if registered is None else bid in registered, controller == bid)
            for bid, b in sorted(self.brokers.items())
        ]
