"""`KafkaZkClient`: Kafka 2.x's ZooKeeper operations over kazoo (Kafka's `KafkaZkClient`).

Every call is synchronous and bounded (a connection loss is retried until
`request_timeout_s`); the asyncio shell runs them in an executor. Watch and session callbacks
run on kazoo's event thread and must not block; hand work to the event loop with
`loop.call_soon_threadsafe`.

Fencing, as in Kafka:
- the **broker epoch** is the creation zxid (czxid) of `/brokers/ids/<id>`; a new session
  re-registers and gets a larger one (KIP-380);
- the **controller epoch** lives in `/controller_epoch` and is incremented in the same ZooKeeper
  transaction that creates the ephemeral `/controller`, conditioned on the epoch znode's
  version; that version (`epoch_zk_version`) is then checked by every controller write
  (`checkControllerAndUpdate`), so a deposed controller's writes fail with
  `ControllerMovedError`;
- partition state writes are compare-and-set on the state znode's version (`zk_version`),
  made by the controller only (leaders send AlterPartition, KIP-497).
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
    UnimplementedError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import Callback, ZnodeStat
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.retry import KazooRetry, RetryFailedError

from tidelog.controller import zk_data
from tidelog.controller.reassignment import (
    REASSIGN_PARTITIONS_PATH,
    decode_reassign_partitions,
    encode_reassign_partitions,
)
from tidelog.controller.zk_data import (
    CONTROLLER_EPOCH_PATH,
    CONTROLLER_PATH,
    INITIAL_CONTROLLER_EPOCH,
    INITIAL_CONTROLLER_EPOCH_ZK_VERSION,
    MATCH_ANY_VERSION,
    BrokerInfo,
    LeaderIsrAndControllerEpoch,
    TopicPartitionT,
)
from tidelog.controller.zk_handler import PollingThreadingHandler
from tidelog.controller.zk_interface import (
    ControllerMovedError,
    KafkaZkReads,
    NoTopicError,
    ZkClientError,
    ZnodeVersionError,
)
from tidelog.controller.zk_multi_read import MULTI_READ_PATHS, multi_read_async

__all__ = [
    "BrokerAlreadyRegisteredError",
    "ControllerElection",
    "ControllerMovedError",
    "KafkaZkClient",
    "NoTopicError",
    "TopicExistsError",
    "WatchHandle",
    "ZkClientError",
]

log = logging.getLogger(__name__)

# In a failed ZooKeeper transaction the ops before the failing one report RolledBack and the
# ops after it RuntimeInconsistency: neither is the cause.
_NOT_THE_CAUSE = (RolledBackError, RuntimeInconsistency)

T = TypeVar("T")


# Builds of `_fenced_many` per ZooKeeper multi: ~150 bytes each, far below jute.maxbuffer.
FENCED_OPS_PER_MULTI = 100


class BrokerAlreadyRegisteredError(ZkClientError):
    """Another live session holds /brokers/ids/<id>."""


class TopicExistsError(ZkClientError):
    """/brokers/topics/<t> already exists."""


@dataclass(frozen=True)
class ControllerElection:
    """The result of `try_elect_controller`; on a loss, the epoch currently in ZooKeeper."""

    elected: bool
    controller_epoch: int
    epoch_zk_version: int
    controller_id: int | None = None

    def __iter__(self) -> Any:  # (elected, controller_epoch, epoch_zk_version)
        return iter((self.elected, self.controller_epoch, self.epoch_zk_version))


class WatchHandle:
    """Stops a watch: after `cancel()` the callback is not called again."""

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _log_dir_event_sequence_numbers(children: Iterable[str]) -> list[str]:
    return sorted(zk_data.log_dir_event_sequence_number(c) for c in children
                  if c.startswith(zk_data.LOG_DIR_EVENT_PREFIX))


class KafkaZkClient(KafkaZkReads):
    def __init__(
        self,
        connect_string: str,
        *,
        session_timeout_ms: int = 18000,
        connection_timeout_ms: int | None = None,
        request_timeout_s: float | None = None,
    ) -> None:
        """`connect_string` may end with a chroot (`127.0.0.1:2181/tidelog`)."""
        self.connect_string = connect_string
        self.session_timeout_ms = session_timeout_ms
        self.connection_timeout_ms = connection_timeout_ms or session_timeout_ms
        self.request_timeout_s = request_timeout_s or max(self.connection_timeout_ms / 1000, 1.0)
        self._zk = KazooClient(
            hosts=connect_string,
            timeout=session_timeout_ms / 1000.0,
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0),
            handler=PollingThreadingHandler(),
        )
        self._lock = threading.Lock()
        self._registered: BrokerInfo | None = None
        self._broker_epoch: int | None = None
        self._session_lost = False
        self._new_session_handlers: list[Callable[[int], None]] = []
        self._session_expired_handlers: list[Callable[[], None]] = []
        self._closed = False
        # False once ZooKeeper answered a multiRead as unknown (a server before 3.6)
        self._multi_read = True
        self._zk.add_listener(self._on_state)

    @classmethod
    def from_config(cls, config: Any) -> KafkaZkClient:
        """From a `tidelog.broker.config.KafkaConfig`."""
        return cls(
            config.zk_connect,
            session_timeout_ms=config.zookeeper_session_timeout_ms,
            connection_timeout_ms=config.zk_connection_timeout_ms,
        )

    # --- session --------------------------------------------------------------------------------

    def start(self, create_top_level_paths: bool = True) -> KafkaZkClient:
        """Connect (bounded by the connection timeout) and create Kafka's persistent paths."""
        try:
            self._zk.start(timeout=self.connection_timeout_ms / 1000.0)
        except KazooTimeoutError:
            self._zk.stop()
            self._zk.close()
            raise ZkClientError(
                f"could not connect to ZooKeeper at {self.connect_string}"
                f" within {self.connection_timeout_ms} ms"
            ) from None
        if create_top_level_paths:
            for path in zk_data.PERSISTENT_PATHS:
                self._retry(self._zk.ensure_path, path)
        return self

    def close(self) -> None:
        """Close the session: its ephemeral znodes (registration, /controller) go at once."""
        if self._closed:
            return
        self._closed = True
        try:
            self._zk.stop()
        finally:
            self._zk.close()

    def __enter__(self) -> KafkaZkClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def session_id(self) -> int:
        sid = self._zk.client_id
        return int(sid[0]) if sid else 0

    @property
    def connected(self) -> bool:
        return bool(self._zk.connected)

    @property
    def kazoo(self) -> KazooClient:
        """The underlying kazoo client (for tests and tools)."""
        return self._zk

    def on_new_session(self, handler: Callable[[int], None]) -> None:
        """Call `handler(new_broker_epoch_or_-1)` after a session expired and a new one began.

        If a broker was registered, it is re-registered first and the handler gets the new
        broker epoch (Kafka's `ZkSessionExpirationHandler` -> `registerBroker`).
        """
        self._new_session_handlers.append(handler)

    def on_session_expired(self, handler: Callable[[], None]) -> None:
        """Call `handler()` when the session is lost (ephemerals gone; a controller resigns)."""
        self._session_expired_handlers.append(handler)

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's connection thread: only flag and spawn, never block here.
        if self._closed:  # our own close() also reports LOST: not an expiry
            return
        if state == KazooState.LOST:
            self._session_lost = True
            for h in list(self._session_expired_handlers):
                self._zk.handler.spawn(_safe_call, h)
        elif state == KazooState.CONNECTED and self._session_lost:
            self._session_lost = False
            self._zk.handler.spawn(self._reinitialize_session)

    def _reinitialize_session(self) -> None:
        epoch = -1
        info = self._registered
        if info is not None:
            if info.clean_shutdown is False:
                # The same process registers again: its logs lost nothing this time.
                info = dataclasses.replace(info, clean_shutdown=None)
            try:
                epoch = self.register_broker(info)
            except Exception:
                log.exception("re-registration of broker %d after session expiry failed",
                              info.broker_id)
        for h in list(self._new_session_handlers):
            _safe_call(h, epoch)

    def _retry(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        retry = KazooRetry(
            max_tries=-1, delay=0.05, max_delay=0.5, deadline=self.request_timeout_s
        )
        try:
            return retry(func, *args, **kwargs)
        except RetryFailedError as e:
            raise ZkClientError(
                f"ZooKeeper request not answered within {self.request_timeout_s} s"
            ) from e

    def sync_watches(self) -> None:
        """Return once every watch callback due for a change ZooKeeper applied before this call
        has run. ZooKeeper sends a session its watch notifications in order with its replies, so
        after a `sync` round trip every earlier notification is on kazoo's callback queue; a
        marker through that queue (one thread, first in first out) then runs after them. A
        barrier for asserting that a change was seen and nothing followed from it."""
        self._retry(self._zk.sync, "/")
        passed = threading.Event()
        self._zk.handler.dispatch_callback(Callback("watch", passed.set, ()))
        if not passed.wait(self.request_timeout_s):
            raise ZkClientError(f"kazoo's callback thread stuck for {self.request_timeout_s} s")

    # --- brokers ----------------------------------------------------------------------------------

    def register_broker(self, info: BrokerInfo) -> int:
        """Create the ephemeral /brokers/ids/<id>; returns the broker epoch (its czxid).

        Refused with `BrokerAlreadyRegisteredError` while another session holds the id. A
        node left by this very session (a retried create) counts as ours, as in Kafka's
        `checkedEphemeralCreate`.
        """
        path = zk_data.broker_path(info.broker_id)
        data = info.encode()

        with self._lock:
            try:
                self._retry(self._zk.create, path, data, ephemeral=True)
            except NodeExistsError:
                pass  # below: ours (a retried create) or another session's
            stat = self._retry(self._zk.exists, path)
            if stat is None or stat.ephemeralOwner != self.session_id:
                raise BrokerAlreadyRegisteredError(
                    f"broker {info.broker_id} is already registered at {path} by another"
                    " session"
                )
            self._registered = info
            self._broker_epoch = int(stat.czxid)
            log.info("registered broker %d at %s, broker epoch %d", info.broker_id, path,
                     stat.czxid)
            return int(stat.czxid)

    @property
    def broker_epoch(self) -> int | None:
        """The epoch of this client's latest registration."""
        return self._broker_epoch

    def deregister_broker(self) -> None:
        """Delete this client's own registration (before a clean exit)."""
        info = self._registered
        self._registered = None
        if info is None:
            return
        path = zk_data.broker_path(info.broker_id)
        stat = self._retry(self._zk.exists, path)
        if stat is not None and stat.ephemeralOwner == self.session_id:
            try:
                self._retry(self._zk.delete, path, version=stat.version)
            except (NoNodeError, BadVersionError):
                pass

    def get_broker(self, broker_id: int) -> tuple[BrokerInfo, int] | None:
        """(registration, broker epoch) or None when the broker is not registered."""
        try:
            data, stat = self._retry(self._zk.get, zk_data.broker_path(broker_id))
        except NoNodeError:
            return None
        return BrokerInfo.decode(broker_id, data), int(stat.czxid)

    def get_all_broker_ids(self) -> list[int]:
        children = self._retry(self._zk.get_children, zk_data.BROKER_IDS_PATH)
        return sorted(int(c) for c in children if c.isdigit())

    def generate_broker_id(self, reserved_broker_max_id: int = 1000) -> int:
        """A fresh broker id: /brokers/seqid's new version + reserved.broker.max.id."""
        self._retry(self._zk.ensure_path, zk_data.BROKER_SEQUENCE_ID_PATH)
        stat = self._retry(self._zk.set, zk_data.BROKER_SEQUENCE_ID_PATH, b"", -1)
        return int(stat.version) + reserved_broker_max_id

    def get_or_create_cluster_id(self, proposed: str | None = None) -> str:
        """The cluster id in /cluster/id, created (url-safe base64 UUID) if missing."""
        try:
            data, _ = self._retry(self._zk.get, zk_data.CLUSTER_ID_PATH)
            return zk_data.decode_cluster_id(data)
        except NoNodeError:
            pass
        cluster_id = proposed or base64.urlsafe_b64encode(uuid.uuid4().bytes).decode()[:22]
        try:
            self._retry(
                self._zk.create, zk_data.CLUSTER_ID_PATH, zk_data.encode_cluster_id(cluster_id),
                makepath=True,
            )
            return cluster_id
        except NodeExistsError:
            data, _ = self._retry(self._zk.get, zk_data.CLUSTER_ID_PATH)
            return zk_data.decode_cluster_id(data)

    # --- controller -------------------------------------------------------------------------------

    def get_controller_id(self) -> int | None:
        try:
            data, _ = self._retry(self._zk.get, CONTROLLER_PATH)
        except NoNodeError:
            return None
        return zk_data.decode_controller(data)

    def get_controller_epoch(self) -> tuple[int, int] | None:
        """(controller epoch, its znode version) or None before the first election."""
        try:
            data, stat = self._retry(self._zk.get, CONTROLLER_EPOCH_PATH)
        except NoNodeError:
            return None
        return zk_data.decode_controller_epoch(data), int(stat.version)

    def _maybe_create_controller_epoch(self) -> tuple[int, int]:
        try:
            self._retry(
                self._zk.create, CONTROLLER_EPOCH_PATH,
                zk_data.encode_controller_epoch(INITIAL_CONTROLLER_EPOCH),
            )
            return INITIAL_CONTROLLER_EPOCH, INITIAL_CONTROLLER_EPOCH_ZK_VERSION
        except NodeExistsError:
            found = self.get_controller_epoch()
            if found is None:
                raise ZkClientError(f"{CONTROLLER_EPOCH_PATH} vanished while read") from None
            return found

    def try_elect_controller(self, broker_id: int) -> ControllerElection:
        """Create /controller and increment /controller_epoch in one transaction.

        Kafka's `registerControllerAndIncrementControllerEpoch`. Elected: the new epoch and the
        epoch znode's version (pass it to every controller write). Lost: `elected=False` with
        the epoch in ZooKeeper and the current controller id.
        """
        found = self.get_controller_epoch()
        cur_epoch, cur_version = found if found is not None else self._maybe_create_controller_epoch()
        new_epoch = cur_epoch + 1

        def attempt() -> list[Any]:
            tx = self._zk.transaction()
            tx.create(CONTROLLER_PATH, zk_data.encode_controller(broker_id), ephemeral=True)
            tx.set_data(CONTROLLER_EPOCH_PATH, zk_data.encode_controller_epoch(new_epoch),
                        cur_version)
            return list(tx.commit())

        results = self._retry(attempt)
        if not any(isinstance(r, Exception) for r in results):
            stat = results[1]
            log.info("broker %d elected controller, epoch %d", broker_id, new_epoch)
            return ControllerElection(True, new_epoch, int(stat.version), broker_id)
        errors = [r for r in results if isinstance(r, Exception) and not isinstance(r, _NOT_THE_CAUSE)]
        if errors and not all(isinstance(e, NodeExistsError | BadVersionError) for e in errors):
            raise ZkClientError(f"controller election failed: {errors[0]!r}")
        # Lost, or our own earlier attempt succeeded before a connection loss (Kafka's
        # checkControllerAndEpoch): decide from what ZooKeeper holds now.
        controller_id = self.get_controller_id()
        now = self.get_controller_epoch()
        epoch, version = now if now is not None else (cur_epoch, cur_version)
        if controller_id == broker_id and epoch == new_epoch:
            owner = self._retry(self._zk.exists, CONTROLLER_PATH)
            if owner is not None and owner.ephemeralOwner == self.session_id:
                return ControllerElection(True, epoch, version, broker_id)
        return ControllerElection(False, epoch, version, controller_id)

    def resign_controller(self, expected_epoch_zk_version: int) -> bool:
        """Delete /controller if this session still owns it and the epoch has not moved."""
        stat = self._retry(self._zk.exists, CONTROLLER_PATH)
        if stat is None or stat.ephemeralOwner != self.session_id:
            return False
        try:
            results = self._fenced(
                expected_epoch_zk_version, lambda tx: tx.delete(CONTROLLER_PATH, stat.version)
            )
        except ControllerMovedError:
            return False
        return not any(isinstance(r, Exception) for r in results)

    # --- controller-fenced writes -------------------------------------------------------------

    def _fenced(
        self, expected_epoch_zk_version: int | None, build: Callable[[Any], None]
    ) -> list[Any]:
        """Run the ops that `build(tx)` adds, after a check on /controller_epoch's version."""

        def attempt() -> list[Any]:
            return list(self._fenced_tx(expected_epoch_zk_version, build).commit())

        return self._strip_check(expected_epoch_zk_version, self._retry(attempt))

    def _fenced_tx(self, expected_epoch_zk_version: int | None, build: Callable[[Any], None]) -> Any:
        tx = self._zk.transaction()
        if expected_epoch_zk_version is not None:
            tx.check(CONTROLLER_EPOCH_PATH, expected_epoch_zk_version)
        build(tx)
        return tx

    @staticmethod
    def _strip_check(expected_epoch_zk_version: int | None, results: list[Any]) -> list[Any]:
        if expected_epoch_zk_version is None:
            return results
        if isinstance(results[0], BadVersionError | NoNodeError):
            raise ControllerMovedError(
                f"{CONTROLLER_EPOCH_PATH} version is no longer {expected_epoch_zk_version}:"
                " another controller was elected"
            )
        return results[1:]

    def _fenced_many(
        self,
        expected_epoch_zk_version: int | None,
        builds: Sequence[tuple[Any, Callable[[Any], None]]],
    ) -> dict[Any, list[Any]]:
        """`_fenced` for many transactions at once, pipelined, `FENCED_OPS_PER_MULTI` of them
        in one multi (behind one check of the controller epoch): kazoo spends a thread loop
        turn per request, and a controlled shutdown at 10,000 partitions writes 10,000 states.
        A multi that fails (one lost compare-and-set rolls back all of it) is replayed one
        transaction per build, as is a transaction whose answer is lost to a connection
        problem; so each build's result is what its own transaction would have answered.
        """
        started = []
        for i in range(0, len(builds), FENCED_OPS_PER_MULTI):
            chunk = builds[i:i + FENCED_OPS_PER_MULTI]
            tx = self._zk.transaction()
            if expected_epoch_zk_version is not None:
                tx.check(CONTROLLER_EPOCH_PATH, expected_epoch_zk_version)
            spans = []
            for key, build in chunk:
                first = len(tx.operations)
                build(tx)
                spans.append((key, build, first, len(tx.operations)))
            started.append((spans, tx.commit_async()))
        out: dict[Any, list[Any]] = {}
        moved: ControllerMovedError | None = None
        for spans, pending in started:
            try:
                raw = list(pending.get(timeout=self.request_timeout_s))
            except (ConnectionLoss, OperationTimeoutError, SessionExpiredError, KazooTimeoutError):
                raw = None
            try:
                if raw is not None and not any(isinstance(r, Exception) for r in raw):
                    for key, _, first, end in spans:
                        out[key] = raw[first:end]
                    continue
                if raw is not None:
                    self._strip_check(expected_epoch_zk_version, raw)  # fenced: raises
                replays = [(key, build, self._fenced_tx(expected_epoch_zk_version, build)
                            .commit_async()) for key, build, _, _ in spans]
                for key, build, again in replays:
                    try:
                        one = list(again.get(timeout=self.request_timeout_s))
                    except (ConnectionLoss, OperationTimeoutError, SessionExpiredError,
                            KazooTimeoutError):
                        out[key] = self._fenced(expected_epoch_zk_version, build)
                        continue
                    out[key] = self._strip_check(expected_epoch_zk_version, one)
            except ControllerMovedError as e:
                moved = e  # collect every answer first: none is left in flight
        if moved is not None:
            raise moved
        return out

    # --- topics -----------------------------------------------------------------------------------

    def create_topic(
        self,
        topic: str,
        assignment: Mapping[int, Sequence[int]],
        config: Mapping[str, Any] | None = None,
        topic_id: UUID | None = None,
    ) -> None:
        """Write /config/topics/<t> then /brokers/topics/<t> (Kafka's AdminZkClient order),
        with the topic's id (KIP-516) in the latter.

        The controller's topic watch sees the assignment and creates the partition states.
        """
        if self._retry(self._zk.exists, zk_data.topic_path(topic)) is not None:
            raise TopicExistsError(f"topic {topic!r} already exists")
        self.set_topic_config(topic, config or {}, notify=False)
        try:
            self._retry(
                self._zk.create, zk_data.topic_path(topic),
                zk_data.encode_topic_assignment(assignment, topic_id), makepath=True,
            )
        except NodeExistsError:
            raise TopicExistsError(f"topic {topic!r} already exists") from None

    def set_topic_assignment(
        self,
        topic: str,
        assignment: Mapping[int, Sequence[int]],
        expected_version: int = MATCH_ANY_VERSION,
        expected_epoch_zk_version: int | None = None,
        topic_id: UUID | None = None,
        adding: Mapping[int, Sequence[int]] | None = None,
        removing: Mapping[int, Sequence[int]] | None = None,
    ) -> int:
        """Overwrite a topic's assignment (partition additions, reassignments with their
        adding/removing replicas) and id (the topic's own, kept; or a first one for a topic
        written before topic ids); returns the new version."""
        data = zk_data.encode_topic_assignment(assignment, topic_id, adding, removing)
        results = self._fenced(
            expected_epoch_zk_version,
            lambda tx: tx.set_data(zk_data.topic_path(topic), data, expected_version),
        )
        if isinstance(results[0], BadVersionError):
            raise ZnodeVersionError(
                f"{zk_data.topic_path(topic)} is no longer at version {expected_version}")
        _raise_first(results)
        return int(results[0].version)

    def get_topic_assignment(self, topic: str) -> dict[int, list[int]] | None:
        znode = self.get_topic_znode(topic)
        return None if znode is None else znode[0]

    def get_topic_znode(self, topic: str) -> tuple[dict[int, list[int]], UUID | None] | None:
        """(assignment, topic id or None for a topic written before ids), None if no topic."""
        try:
            data, _ = self._retry(self._zk.get, zk_data.topic_path(topic))
        except NoNodeError:
            return None
        return zk_data.decode_topic_znode(topic, data)

    def get_topic_id(self, topic: str) -> UUID | None:
        znode = self.get_topic_znode(topic)
        return None if znode is None else znode[1]

    def get_topic_reassignments(
        self, topic: str
    ) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        """The topic znode's (adding_replicas, removing_replicas); empty when no topic."""
        try:
            data, _ = self._retry(self._zk.get, zk_data.topic_path(topic))
        except NoNodeError:
            return {}, {}
        return zk_data.decode_topic_reassignments(topic, data)

    # --- /admin/reassign_partitions (the legacy reassignment znode) -----------------------------

    def get_partition_reassignment(self) -> dict[TopicPartitionT, list[int]] | None:
        """The legacy znode's targets; None when absent; {} when unreadable (as Kafka, which
        logs and ignores it)."""
        try:
            data, _ = self._retry(self._zk.get, REASSIGN_PARTITIONS_PATH)
        except NoNodeError:
            return None
        try:
            return decode_reassign_partitions(data)
        except ValueError:
            log.warning("unreadable %s: %r", REASSIGN_PARTITIONS_PATH, data)
            return {}

    def set_partition_reassignment(
        self, targets: Mapping[TopicPartitionT, Sequence[int]],
        expected_epoch_zk_version: int | None = None,
    ) -> None:
        """Rewrite the legacy znode with `targets`, deleting it when empty (Kafka's controller
        removes each partition as its move completes). An admin's write (no epoch) creates it."""
        path = REASSIGN_PARTITIONS_PATH

        def build(tx: Any) -> None:
            if not targets:
                tx.delete(path)
            elif self._zk.exists(path) is None:
                tx.create(path, encode_reassign_partitions(targets))
            else:
                tx.set_data(path, encode_reassign_partitions(targets))

        _raise_first(self._fenced(expected_epoch_zk_version, build), ignore=(NoNodeError,))

    def watch_partition_reassignment(self, callback: Callable[[bool], None]) -> WatchHandle:
        """`callback(exists)` now and whenever /admin/reassign_partitions is created, changed
        or deleted."""
        handle = WatchHandle()

        def on_data(_data: bytes | None, stat: ZnodeStat | None) -> bool | None:
            if handle.cancelled:
                return False
            _safe_call(callback, stat is not None)
            return None

        DataWatch(self._zk, REASSIGN_PARTITIONS_PATH, on_data)
        return handle

    def get_all_topics(self) -> set[str]:
        return set(self._retry(self._zk.get_children, zk_data.TOPICS_PATH))

    def topic_exists(self, topic: str) -> bool:
        return self._retry(self._zk.exists, zk_data.topic_path(topic)) is not None

    def get_partitions_for_topics(self, topics: Iterable[str]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for t in topics:
            a = self.get_topic_assignment(t)
            if a is not None:
                out[t] = sorted(a)
        return out

    def delete_topic_znodes(self, topic: str, expected_epoch_zk_version: int | None = None) -> None:
        """Remove /brokers/topics/<t> (with its partition states) and /config/topics/<t>.

        The last step of a topic deletion, done by the controller: checked against the
        controller epoch when `expected_epoch_zk_version` is given.
        """
        # A concurrent change (a partition state created meanwhile) fails the transaction
        # with NoNode/NotEmpty: walk the tree again, a bounded number of times.
        for _ in range(5):
            paths = self._subtree(zk_data.topic_path(topic))
            config_path = zk_data.topic_config_path(topic)
            if self._retry(self._zk.exists, config_path) is not None:
                paths.append(config_path)
            if not paths:
                return

            def build(tx: Any, paths: list[str] = paths) -> None:
                for p in paths:
                    tx.delete(p)

            results = self._fenced(expected_epoch_zk_version, build)
            if not any(isinstance(r, NoNodeError | NotEmptyError) for r in results):
                _raise_first(results)
                return
        raise ZkClientError(f"could not delete the znodes of topic {topic!r}: they keep changing")

    def _subtree(self, root: str) -> list[str]:
        """`root` and its descendants, deepest first (the order a delete needs)."""
        out: list[str] = []

        def walk(path: str) -> None:
            try:
                children = self._retry(self._zk.get_children, path)
            except NoNodeError:
                return
            for c in children:
                walk(f"{path}/{c}")
            out.append(path)

        walk(root)
        return out

    # --- partition state --------------------------------------------------------------------------

    def create_partition_state(
        self,
        tp: TopicPartitionT,
        state: LeaderIsrAndControllerEpoch,
        expected_epoch_zk_version: int | None = None,
    ) -> int:
        """Create /brokers/topics/<t>/partitions/<p>/state; returns its zk version (0).

        Raises kazoo's `NodeExistsError` if it exists, `NoTopicError` if the topic does not
        (a deleted topic is never resurrected), `ControllerMovedError` when fenced.
        """
        try:
            for parent in (zk_data.topic_partitions_path(tp[0]),
                           zk_data.topic_partition_path(tp)):
                try:
                    self._retry(self._zk.create, parent, b"")
                except NodeExistsError:
                    pass
            data = state.encode()
            results = self._fenced(
                expected_epoch_zk_version,
                lambda tx: tx.create(zk_data.partition_state_path(tp), data),
            )
            _raise_first(results)
        except NoNodeError:
            raise NoTopicError(f"topic {tp[0]} does not exist") from None
        return 0

    def create_partition_states(
        self,
        states: Mapping[TopicPartitionT, LeaderIsrAndControllerEpoch],
        expected_epoch_zk_version: int | None = None,
    ) -> dict[TopicPartitionT, bool]:
        """Create many state znodes, pipelined; True = created, False = already existed.

        Raises `NoTopicError` if a topic does not exist, `ControllerMovedError` when fenced.
        """
        try:
            return self._create_partition_states(states, expected_epoch_zk_version)
        except NoNodeError:
            topics = sorted({tp[0] for tp in states})
            raise NoTopicError(f"topic(s) {', '.join(topics)} do not exist") from None

    def _create_partition_states(
        self,
        states: Mapping[TopicPartitionT, LeaderIsrAndControllerEpoch],
        expected_epoch_zk_version: int | None,
    ) -> dict[TopicPartitionT, bool]:
        keys = [(tp[0], tp[1]) for tp in states]
        # Parents first, level by level (/partitions, then /partitions/<p>), pipelined.
        self._create_empty_nodes(sorted({zk_data.topic_partitions_path(t) for t, _ in keys}))
        self._create_empty_nodes([zk_data.topic_partition_path(tp) for tp in keys])
        builds = []
        for key, state in zip(keys, states.values(), strict=True):
            path, data = zk_data.partition_state_path(key), state.encode()
            builds.append((key, lambda tx, p=path, d=data: tx.create(p, d)))
        out: dict[TopicPartitionT, bool] = {}
        for key, results in self._fenced_many(expected_epoch_zk_version, builds).items():
            if isinstance(results[0], NodeExistsError):
                out[key] = False
            else:
                _raise_first(results)
                out[key] = True
        return out

    def _create_empty_nodes(self, paths: Sequence[str]) -> None:
        """Create persistent empty znodes; existing ones are fine. `FENCED_OPS_PER_MULTI` to a
        multi, the multis pipelined: a request per znode cost a turn of kazoo's connection
        loop each (a new topic's 5,000 partition znodes: most of the controller's ZooKeeper
        work, in its process, while its broker creates the logs). A multi that fails (a znode
        exists, or its parent does not) or is lost is redone one create per znode."""
        sent: list[tuple[Sequence[str], Any]] = []
        for i in range(0, len(paths), FENCED_OPS_PER_MULTI):
            chunk = paths[i:i + FENCED_OPS_PER_MULTI]
            tx = self._zk.transaction()
            for p in chunk:
                tx.create(p, b"")
            sent.append((chunk, tx.commit_async()))
        one_by_one: list[str] = []
        for chunk, answer in sent:
            try:
                results = answer.get(timeout=self.request_timeout_s)
            except (ConnectionLoss, OperationTimeoutError, SessionExpiredError,
                    KazooTimeoutError):
                results = None
            if results is None or any(isinstance(r, Exception) for r in results):
                one_by_one.extend(chunk)
        pending = [(p, self._zk.create_async(p, b"")) for p in one_by_one]
        for p, result in pending:
            try:
                result.get(timeout=self.request_timeout_s)
            except NodeExistsError:
                pass
            except (ConnectionLoss, OperationTimeoutError, KazooTimeoutError):
                try:
                    self._retry(self._zk.create, p, b"")
                except NodeExistsError:
                    pass

    def get_partition_state(self, tp: TopicPartitionT) -> LeaderIsrAndControllerEpoch | None:
        """The state with `zk_version` set to the znode's version, or None."""
        try:
            data, stat = self._retry(self._zk.get, zk_data.partition_state_path(tp))
        except NoNodeError:
            return None
        return LeaderIsrAndControllerEpoch.decode(tp, data, int(stat.version))

    def get_partition_states(
        self, tps: Iterable[TopicPartitionT]
    ) -> dict[TopicPartitionT, LeaderIsrAndControllerEpoch]:
        """`get_partition_state` for many, pipelined (Kafka's getTopicPartitionStatesRaw): the
        controller re-reads every partition of a broker at its shutdown or failure, one round
        trip each took tens of seconds at 10,000 partitions. A read whose answer is lost to a
        connection problem is retried on its own."""
        paths = {zk_data.partition_state_path(tp): (tp[0], tp[1]) for tp in tps}
        read = self._get_many(list(paths))
        return {tp: LeaderIsrAndControllerEpoch.decode(tp, read[path][0], int(read[path][1].version))
                for path, tp in paths.items() if path in read}

    def _get_many(self, paths: Sequence[str]) -> dict[str, tuple[bytes, ZnodeStat]]:
        """(data, stat) of each znode, read pipelined; a missing one is left out. Read as
        multiRead requests of `MULTI_READ_PATHS` znodes (zk_multi_read.py), or one getData per
        znode from a ZooKeeper before 3.6; a read whose answer is lost to a connection problem
        is retried on its own."""
        out: dict[str, tuple[bytes, ZnodeStat]] = {}
        if self._multi_read:
            chunks = [paths[i:i + MULTI_READ_PATHS] for i in range(0, len(paths), MULTI_READ_PATHS)]
            sent = [(chunk, multi_read_async(self._zk, chunk)) for chunk in chunks]
            unread: list[str] = []
            for chunk, answer in sent:
                try:
                    reads = answer.get(timeout=self.request_timeout_s)
                except UnimplementedError:
                    if self._multi_read:
                        log.info("ZooKeeper has no multiRead (before 3.6): reading znodes one "
                                 "request each")
                    self._multi_read = False
                    unread.extend(chunk)
                    continue
                except (ConnectionLoss, OperationTimeoutError, SessionExpiredError,
                        KazooTimeoutError):
                    unread.extend(chunk)
                    continue
                for path, read in zip(chunk, reads, strict=True):
                    if isinstance(read, NoNodeError):
                        continue
                    if isinstance(read, Exception):
                        raise read
                    out[path] = read
            paths = unread
        pending = [(path, self._zk.get_async(path)) for path in paths]
        for path, result in pending:
            try:
                out[path] = result.get(timeout=self.request_timeout_s)
            except NoNodeError:
                continue
            except (ConnectionLoss, OperationTimeoutError, SessionExpiredError, KazooTimeoutError):
                try:
                    out[path] = self._retry(self._zk.get, path)
                except NoNodeError:
                    continue
        return out

    def update_leader_and_isr(
        self,
        tp: TopicPartitionT,
        state: LeaderIsrAndControllerEpoch,
        expected_zk_version: int,
        expected_epoch_zk_version: int | None = None,
    ) -> tuple[bool, int]:
        """Compare-and-set the partition state; returns (ok, new zk version).

        `expected_zk_version` is the state znode's version the caller last saw. A stale one
        returns `(False, -1)`, unless ZooKeeper already holds exactly `state` (our own write
        that succeeded before a connection loss: Kafka's `checkLeaderAndIsrZkData`), which
        returns `(True, version)`.

        The controller passes `expected_epoch_zk_version` (from `try_elect_controller`): the
        write is then checked against /controller_epoch in the same transaction and raises
        `ControllerMovedError` when another controller was elected since (None: the zk
        version alone).
        """
        path, data = zk_data.partition_state_path(tp), state.encode()
        results = self._fenced(expected_epoch_zk_version,
                               lambda tx: tx.set_data(path, data, expected_zk_version))
        return self._state_update_result(tp, state, results[0])

    def update_leader_and_isr_many(
        self,
        updates: Iterable[tuple[TopicPartitionT, LeaderIsrAndControllerEpoch, int]],
        expected_epoch_zk_version: int | None = None,
    ) -> dict[TopicPartitionT, tuple[bool, int]]:
        """`update_leader_and_isr` for many (tp, state, expected_zk_version), pipelined.

        Kafka's controller writes a whole election round this way. Raises
        `ControllerMovedError` if the controller epoch moved on.
        """
        builds = []
        states: dict[TopicPartitionT, LeaderIsrAndControllerEpoch] = {}
        for tp, state, expected in updates:
            key = (tp[0], tp[1])
            states[key] = state
            path, data = zk_data.partition_state_path(key), state.encode()
            builds.append(
                (key, lambda tx, p=path, d=data, v=expected: tx.set_data(p, d, v))
            )
        results = self._fenced_many(expected_epoch_zk_version, builds)
        # The lost compare-and-sets' current states, read pipelined (a burst of ISR changes by
        # the leaders can make thousands of them lose at once).
        lost = [tp for tp, res in results.items() if isinstance(res[0], BadVersionError)]
        current = self.get_partition_states(lost) if lost else {}
        out: dict[TopicPartitionT, tuple[bool, int]] = {}
        for tp, res in results.items():
            if isinstance(res[0], BadVersionError):
                now = current.get(tp)
                out[tp] = ((True, now.zk_version) if now is not None
                           and now.same_state(states[tp]) else (False, -1))
            else:
                out[tp] = self._state_update_result(tp, states[tp], res[0])
        return out

    def _state_update_result(
        self, tp: TopicPartitionT, state: LeaderIsrAndControllerEpoch, result: Any
    ) -> tuple[bool, int]:
        if isinstance(result, ZnodeStat):
            return True, int(result.version)
        if isinstance(result, BadVersionError):
            return self._lost_compare_and_set(tp, state)
        if isinstance(result, NoNodeError):
            return False, -1
        raise ZkClientError(f"update of {zk_data.partition_state_path(tp)} failed: {result!r}")

    # --- ISR change notifications -----------------------------------------------------------------

    def propagate_isr_changes(self, partitions: Iterable[TopicPartitionT]) -> str:
        """Create a sequential /isr_change_notification/isr_change_<seq>; returns its name."""
        data = zk_data.encode_isr_change_notification(partitions)
        path = self._retry(
            self._zk.create,
            f"{zk_data.ISR_CHANGE_NOTIFICATION_PATH}/{zk_data.ISR_CHANGE_PREFIX}",
            data,
            sequence=True,
            makepath=True,
        )
        return path.rsplit("/", 1)[-1]

    def get_all_isr_change_notifications(self) -> list[str]:
        """The sequence numbers of pending notifications, oldest first."""
        try:
            children = self._retry(self._zk.get_children, zk_data.ISR_CHANGE_NOTIFICATION_PATH)
        except NoNodeError:
            return []
        return sorted(
            zk_data.isr_change_sequence_number(c)
            for c in children
            if c.startswith(zk_data.ISR_CHANGE_PREFIX)
        )

    def get_partitions_from_isr_change_notifications(
        self, sequence_numbers: Iterable[str]
    ) -> set[TopicPartitionT]:
        """The partitions the notifications name, read pipelined (Kafka's
        getPartitionsFromIsrChangeNotifications): after creating 10,000 partitions hundreds
        pile up, and one round trip each kept the controller's queue busy."""
        # (a notification gone meanwhile was deleted by an earlier controller)
        read = self._get_many([zk_data.isr_change_path(seq) for seq in sequence_numbers])
        out: set[TopicPartitionT] = set()
        for path, (data, _) in read.items():
            out |= zk_data.decode_isr_change_notification(path, data)
        return out

    def delete_isr_change_notifications(
        self,
        sequence_numbers: Iterable[str] | None = None,
        expected_epoch_zk_version: int | None = None,
    ) -> None:
        """Delete the given notifications (all when None), fenced by the controller epoch,
        pipelined as Kafka's deleteIsrChangeNotifications."""
        seqs = (
            list(sequence_numbers)
            if sequence_numbers is not None
            else self.get_all_isr_change_notifications()
        )
        builds = [(seq, lambda tx, s=seq: tx.delete(zk_data.isr_change_path(s))) for seq in seqs]
        for results in self._fenced_many(expected_epoch_zk_version, builds).values():
            _raise_first(results, ignore=(NoNodeError,))

    # --- log dir event notifications (a broker's log dir failed) -----------------------------------

    def propagate_log_dir_event(self, broker_id: int) -> str:
        """Kafka's propagateLogDirEvent: a sequential
        /log_dir_event_notification/log_dir_event_<seq> naming the broker; returns its name."""
        path = self._retry(
            self._zk.create,
            zk_data.log_dir_event_path(""),
            zk_data.encode_log_dir_event_notification(broker_id),
            sequence=True,
            makepath=True,
        )
        return path.rsplit("/", 1)[-1]

    def get_all_log_dir_event_notifications(self) -> list[str]:
        """The sequence numbers of pending log dir events, oldest first."""
        try:
            children = self._retry(self._zk.get_children,
                                   zk_data.LOG_DIR_EVENT_NOTIFICATION_PATH)
        except NoNodeError:
            return []
        return _log_dir_event_sequence_numbers(children)

    def get_broker_ids_from_log_dir_events(self, sequence_numbers: Iterable[str]) -> list[int]:
        """The brokers the notifications name, oldest first, read pipelined (a notification
        gone meanwhile was deleted by an earlier controller)."""
        read = self._get_many([zk_data.log_dir_event_path(seq) for seq in sequence_numbers])
        return [zk_data.decode_log_dir_event_notification(path, data)
                for path, (data, _) in read.items()]

    def delete_log_dir_event_notifications(self, sequence_numbers: Iterable[str],
                                           expected_epoch_zk_version: int | None = None) -> None:
        """Delete handled notifications, fenced by the controller epoch."""
        builds = [(seq, lambda tx, s=seq: tx.delete(zk_data.log_dir_event_path(s)))
                  for seq in sequence_numbers]
        for results in self._fenced_many(expected_epoch_zk_version, builds).values():
            _raise_first(results, ignore=(NoNodeError,))

    # --- KIP-966 marks --------------------------------------------------------------------------

    def set_unclean_replicas(
        self,
        marks: Mapping[TopicPartitionT, Iterable[int]],
        expected_epoch_zk_version: int | None = None,
    ) -> None:
        """Write the marks (creating the znode), fenced by the controller epoch."""
        path = zk_data.UNCLEAN_REPLICAS_PATH
        data = zk_data.encode_unclean_replicas(marks)
        try:
            self._retry(self._zk.ensure_path, path.rsplit("/", 1)[0])
        except NodeExistsError:
            pass
        exists = self._retry(self._zk.exists, path) is not None

        def build(tx: Any) -> None:
            if exists:
                tx.set_data(path, data)
            else:
                tx.create(path, data)

        _raise_first(self._fenced(expected_epoch_zk_version, build))

    # --- plain znodes ---------------------------------------------------------------------------

    def get_data_and_version(self, path: str) -> tuple[bytes | None, int]:
        """(data, version); (None, -1) when the znode does not exist (Kafka's
        `getDataAndVersion`)."""
        try:
            data, stat = self._retry(self._zk.get, path)
        except NoNodeError:
            return None, -1
        return data, int(stat.version)

    def create_path(self, path: str, data: bytes) -> bool:
        """Create a persistent znode and its parents; False if it already existed."""
        try:
            self._retry(self._zk.create, path, data, makepath=True)
        except NodeExistsError:
            return False
        return True

    def conditional_update_path(self, path: str, data: bytes, expected_version: int) -> bool:
        """Set the data iff the znode is at `expected_version` (Kafka's
        `conditionalUpdatePath`); False on another version or no znode."""
        try:
            self._retry(self._zk.set, path, data, version=expected_version)
        except (BadVersionError, NoNodeError):
            return False
        return True

    # --- topic deletion ---------------------------------------------------------------------------

    def create_delete_topic_path(self, topic: str) -> None:
        """Mark a topic for deletion (/admin/delete_topics/<t>); idempotent."""
        try:
            self._retry(self._zk.create, zk_data.delete_topic_path(topic), b"", makepath=True)
        except NodeExistsError:
            pass

    def get_topic_deletions(self) -> set[str]:
        try:
            return set(self._retry(self._zk.get_children, zk_data.DELETE_TOPICS_PATH))
        except NoNodeError:
            return set()

    def is_topic_marked_for_deletion(self, topic: str) -> bool:
        return self._retry(self._zk.exists, zk_data.delete_topic_path(topic)) is not None

    def delete_topic_deletions(
        self, topics: Iterable[str], expected_epoch_zk_version: int | None = None
    ) -> None:
        for topic in topics:
            _raise_first(
                self._fenced(
                    expected_epoch_zk_version,
                    lambda tx, t=topic: tx.delete(zk_data.delete_topic_path(t)),
                ),
                ignore=(NoNodeError,),
            )

    # --- topic configs ----------------------------------------------------------------------------

    def set_topic_config(
        self, topic: str, config: Mapping[str, Any], notify: bool = True
    ) -> None:
        """Set or create /config/topics/<t>; with `notify`, add a /config/changes entry."""
        self._set_entity_config(zk_data.topic_config_path(topic), f"topics/{topic}", config, notify)

    def set_broker_config(self, entity: str, config: Mapping[str, Any]) -> None:
        """Set /config/brokers/<id> (or <default>) and notify every broker."""
        self._set_entity_config(zk_data.broker_config_path(entity), f"brokers/{entity}", config,
                                True)

    def get_broker_config(self, entity: str) -> dict[str, str]:
        """The dynamic configs of broker `entity` (or <default>); {} when none."""
        path = zk_data.broker_config_path(entity)
        try:
            data, _ = self._retry(self._zk.get, path)
        except NoNodeError:
            return {}
        return zk_data.decode_config(path, data)

    def _set_entity_config(self, path: str, entity_path: str, config: Mapping[str, Any],
                           notify: bool) -> None:
        data = zk_data.encode_config(config)
        try:
            self._retry(self._zk.set, path, data)
        except NoNodeError:
            try:
                self._retry(self._zk.create, path, data, makepath=True)
            except NodeExistsError:
                self._retry(self._zk.set, path, data)
        if notify:
            self._retry(
                self._zk.create,
                f"{zk_data.CONFIG_CHANGES_PATH}/{zk_data.CONFIG_CHANGE_PREFIX}",
                zk_data.encode_config_change(entity_path),
                sequence=True,
                makepath=True,
            )

    def get_config_change(self, name: str) -> str | None:
        """The entity path of notification /config/changes/<name> (None once purged)."""
        path = f"{zk_data.CONFIG_CHANGES_PATH}/{name}"
        try:
            data, _ = self._retry(self._zk.get, path)
        except NoNodeError:
            return None
        return zk_data.decode_config_change(path, data)

    def purge_obsolete_config_changes(self, names: Iterable[str], now_ms: int,
                                      expiration_ms: int) -> list[str]:
        """Delete the /config/changes notifications among `names` created more than
        `expiration_ms` before `now_ms` (Kafka's ZkNodeChangeNotificationListener
        purgeObsoleteNotifications, run by every broker after it processed the notifications);
        returns the names deleted."""
        purged: list[str] = []
        for name in sorted(names, key=zk_data.config_change_sequence_number):
            path = f"{zk_data.CONFIG_CHANGES_PATH}/{name}"
            stat = self._retry(self._zk.exists, path)
            if stat is None or now_ms - int(stat.ctime) <= expiration_ms:
                continue
            try:
                self._retry(self._zk.delete, path)
            except NoNodeError:
                continue  # another broker purged it first
            purged.append(name)
        return purged

    def get_topic_config(self, topic: str) -> dict[str, str]:
        """The topic's overrides ({} when none)."""
        path = zk_data.topic_config_path(topic)
        try:
            data, _ = self._retry(self._zk.get, path)
        except NoNodeError:
            return {}
        return zk_data.decode_config(path, data)

    # --- watches ----------------------------------------------------------------------------------

    def _watch_children(
        self, path: str, callback: Callable[[list[str]], None]
    ) -> WatchHandle:
        handle = WatchHandle()
        self._retry(self._zk.ensure_path, path)

        def on_children(children: list[str]) -> bool | None:
            if handle.cancelled:
                return False
            _safe_call(callback, sorted(children))
            return None

        ChildrenWatch(self._zk, path, on_children)
        return handle

    def watch_broker_changes(self, callback: Callable[[list[int]], None]) -> WatchHandle:
        """`callback(sorted live broker ids)` now and on every change of /brokers/ids."""
        return self._watch_children(
            zk_data.BROKER_IDS_PATH,
            lambda ids: callback(sorted(int(i) for i in ids if i.isdigit())),
        )

    def watch_topic_changes(self, callback: Callable[[set[str]], None]) -> WatchHandle:
        """`callback(set of topics)` now and whenever a topic is created or removed."""
        return self._watch_children(zk_data.TOPICS_PATH, lambda ts: callback(set(ts)))

    def watch_isr_change_notifications(
        self, callback: Callable[[list[str]], None]
    ) -> WatchHandle:
        """`callback(sorted sequence numbers)` now and whenever notifications change."""
        return self._watch_children(
            zk_data.ISR_CHANGE_NOTIFICATION_PATH,
            lambda cs: callback(
                sorted(
                    zk_data.isr_change_sequence_number(c)
                    for c in cs
                    if c.startswith(zk_data.ISR_CHANGE_PREFIX)
                )
            ),
        )

    def watch_log_dir_event_notifications(
        self, callback: Callable[[list[str]], None]
    ) -> WatchHandle:
        """`callback(sorted sequence numbers)` now and whenever log dir events change."""
        return self._watch_children(
            zk_data.LOG_DIR_EVENT_NOTIFICATION_PATH,
            lambda cs: callback(_log_dir_event_sequence_numbers(cs)))

    def watch_config_changes(self, callback: Callable[[list[str]], None]) -> WatchHandle:
        """`callback(sorted notification names)` now and whenever /config/changes changes."""
        return self._watch_children(
            zk_data.CONFIG_CHANGES_PATH,
            lambda cs: callback(sorted((c for c in cs if c.startswith(zk_data.CONFIG_CHANGE_PREFIX)),
                                       key=zk_data.config_change_sequence_number)))

    def watch_delete_topics(self, callback: Callable[[set[str]], None]) -> WatchHandle:
        """`callback(set of topics marked for deletion)` now and on every change."""
        return self._watch_children(zk_data.DELETE_TOPICS_PATH, lambda ts: callback(set(ts)))

    def watch_controller(self, callback: Callable[[int | None], None]) -> WatchHandle:
        """`callback(controller id or None)` now and whenever /controller changes."""
        handle = WatchHandle()

        def on_data(data: bytes | None, stat: ZnodeStat | None) -> bool | None:
            if handle.cancelled:
                return False
            controller_id: int | None = None
            if stat is not None and data:
                try:
                    controller_id = zk_data.decode_controller(data)
                except zk_data.ZkDataError:
                    log.warning("unreadable %s: %r", CONTROLLER_PATH, data)
            _safe_call(callback, controller_id)
            return None

        DataWatch(self._zk, CONTROLLER_PATH, on_data)
        return handle

    def watch_topic_assignment(
        self, topic: str, callback: Callable[[dict[int, list[int]] | None], None]
    ) -> WatchHandle:
        """`callback(assignment or None)` now and whenever /brokers/topics/<t> changes."""
        handle = WatchHandle()

        def on_data(data: bytes | None, stat: ZnodeStat | None) -> bool | None:
            if handle.cancelled:
                return False
            assignment = None
            if stat is not None and data:
                try:
                    assignment = zk_data.decode_topic_assignment(topic, data)
                except zk_data.ZkDataError:
                    log.warning("unreadable assignment of %s", topic)
            _safe_call(callback, assignment)
            return None

        DataWatch(self._zk, zk_data.topic_path(topic), on_data)
        return handle


def _raise_first(
    results: Sequence[Any], ignore: tuple[type[BaseException], ...] = ()
) -> None:
    for r in results:
        if isinstance(r, Exception) and not isinstance(r, _NOT_THE_CAUSE):
            if ignore and isinstance(r, ignore):
                continue
            if isinstance(r, KazooException):
                raise r
            raise ZkClientError(repr(r))


def _safe_call(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("ZooKeeper callback %r failed", fn)
