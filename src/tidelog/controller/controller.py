"""`KafkaController`: the ZooKeeper-elected controller, run on every broker (Kafka 2.x).

Every broker runs one. It campaigns for `/controller` at startup and whenever the znode goes
away; the winner increments `/controller_epoch` in the same transaction (`KafkaZkClient`),
loads the cluster (live brokers with their epochs, topics, assignments, partition states) into
the pure `ControllerCore`, opens a channel to every live broker, watches ZooKeeper and acts.

One event queue, as Kafka's `ControllerEventManager`: every ZooKeeper watch, every
ControlledShutdown request and every scheduled check becomes an event, handled one at a time in
arrival order by a single task. kazoo's callbacks (its own thread) only enqueue. ZooKeeper calls
run in the controller's own worker thread and are awaited by the handler, so the queue stays
strictly sequential. Its own: in the shared default executor they queued behind the broker's
ISR writes (thousands at once after a large topic's creation), as if Kafka's controller event
thread waited for the replica manager's.

An event runs the core (`Decision`) through `executor.DecisionExecutor`, the execute loop the
simulated controller runs too: partition states written as compare-and-sets fenced by the
controller epoch's znode version (a write after another controller was elected fails with
`ControllerMovedError`, upon which this controller resigns), results committed into the core,
a lost compare-and-set re-read and the event replayed (bounded), KIP-966 marks persisted. The
resulting LeaderAndIsr / UpdateMetadata / StopReplica requests are queued per broker on the
`ControllerChannelManager`.

Events: broker change (join, leave, bounce = new broker epoch), topic change (new assignment ->
initial leaders), ISR change notifications, topic deletion, controlled shutdown, the preferred
leader rebalance check (`auto.leader.rebalance.enable`), controller change / re-election, and
ZooKeeper session expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from uuid import UUID

from tidelog.controller import zk_data
from tidelog.controller.admin import new_topic_id
from tidelog.controller.channel_manager import (
    LEADER_DURING_DELETE,
    ControllerChannelManager,
    leader_and_isr_partition_errors,
)
from tidelog.controller.core import (
    ControllerCore,
    Decision,
    LeaderAndIsrRequest,
    StopReplicaRequest,
    UpdateMetadataRequest,
)
from tidelog.controller.executor import AlterPartitionOutcome, DecisionExecutor, Executed
from tidelog.controller.reassignment_manager import ControllerReassignments, rewrite_topic_znode
from tidelog.controller.zk_client import KafkaZkClient, WatchHandle
from tidelog.controller.zk_data import BrokerInfo, LeaderIsrAndControllerEpoch
from tidelog.controller.zk_interface import ControllerMovedError, from_zk_state
from tidelog.protocol.errors import ErrorCode
from tidelog.replication.types import (
    NO_LEADER,
    LeaderAndIsrPartitionState,
    ProposeIsr,
    TopicPartition,
)

__all__ = ["KafkaController"]

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_DELETION_RETRIES = 5
DELETION_RETRY_BACKOFF_S = 0.2


class _TopicAwareCore(ControllerCore):
    """`ControllerCore` with Kafka's per-topic `unclean.leader.election.enable` (a topic
    override, else the broker's value): the core's elections read one flag, set here for the
    partition being elected."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.default_unclean = self.unclean_leader_election_enable
        self.topic_unclean: dict[str, bool] = {}

    def unclean_enabled_for(self, topic: str) -> bool:
        return self.topic_unclean.get(topic, self.default_unclean)

    def _elect(self, tp: TopicPartition, state: LeaderAndIsrPartitionState,
               reason: str) -> Any:
        self.unclean_leader_election_enable = self.unclean_enabled_for(tp.topic)
        try:
            return super()._elect(tp, state, reason)
        finally:
            self.unclean_leader_election_enable = self.default_unclean


def _unclean_override(config: dict[str, str]) -> bool | None:
    value = config.get("unclean.leader.election.enable")
    if value is None:
        return None
    return value.strip().lower() == "true"


async def _nothing() -> None:
    return None


class _Event:
    __slots__ = ("name", "handler", "future", "queued_at")

    def __init__(self, name: str, handler: Callable[[], Awaitable[Any]],
                 future: asyncio.Future[Any] | None) -> None:
        self.name = name
        self.handler = handler
        self.future = future
        self.queued_at = time.monotonic()


# An event that takes longer is logged with its time in the queue (Kafka's controller keeps
# both as metrics: EventQueueTimeMs and the per-state rate and time).
SLOW_EVENT_S = 1.0


class KafkaController:
    """The controller of one broker; active only on the broker that won `/controller`."""

    def __init__(self, config: Any, zk_client: KafkaZkClient, broker_id: int) -> None:
        self.config = config
        self.zk_client = zk_client
        self.broker_id = broker_id
        self.is_active = False
        self.active_controller_id: int | None = None
        self.controller_epoch = 0
        self.epoch_zk_version = -1
        self.core: ControllerCore | None = None
        # Carries out the core's decisions (the loop the simulated controller runs too).
        self.executor: DecisionExecutor | None = None
        self.channel: ControllerChannelManager | None = None
        self.topics: set[str] = set()
        # Each topic's id (KIP-516), from its znode; sent to the brokers in UpdateMetadata.
        self.topic_ids: dict[str, UUID] = {}
        self.topics_to_be_deleted: set[str] = set()
        self._deleting: dict[str, dict[TopicPartition, tuple[int, ...]]] = {}
        self._deletion_assignments: dict[str, dict[TopicPartition, tuple[int, ...]]] = {}
        self._deletion_failures: dict[str, int] = {}
        self._watches: list[WatchHandle] = []
        # Kafka's PartitionModificationsHandler: one watch per topic's /brokers/topics/<t>.
        self._partition_watches: dict[str, WatchHandle] = {}
        self._controller_watch: WatchHandle | None = None
        self._queue: asyncio.Queue[_Event] = asyncio.Queue()
        self._zk_thread = ThreadPoolExecutor(1, thread_name_prefix=f"controller-{broker_id}-zk")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: set[asyncio.TimerHandle] = set()
        self._rebalance_task: asyncio.Task[None] | None = None
        self._closing = False
        self._topics_without_partitions: set[str] = set()
        # unclean.leader.election.enable as a dynamic broker config set it (None: the static one)
        self._dynamic_unclean: bool | None = None
        # observable history, for tools and tests: (controller epoch) of each time we won
        self.elections_won: list[int] = []
        # KIP-455 reassignments: the phases around controller/reassignment.py's decisions.
        self.reassignments = ControllerReassignments(self)

    # -- configuration ---------------------------------------------------------------------
    def _cfg(self, key: str, default: Any) -> Any:
        try:
            return self.config.get(key)
        except Exception:  # noqa: BLE001 - a config object without the key
            return default

    # -- lifecycle -------------------------------------------------------------------------
    async def startup(self) -> None:
        """Start the event queue, watch /controller and campaign (Kafka's `Startup` event)."""
        self._loop = asyncio.get_running_loop()
        self._event_task = self._loop.create_task(self._process_events(),
                                                  name=f"controller-{self.broker_id}-events")
        self.zk_client.on_session_expired(
            lambda: self._enqueue_threadsafe("Expire", self._on_session_expired))
        self.zk_client.on_new_session(
            lambda _epoch: self._enqueue_threadsafe("RegisterBrokerAndReelect", self._reelect))
        self._controller_watch = await self._zk(
            self.zk_client.watch_controller,
            lambda cid: self._enqueue_threadsafe(
                "ControllerChange", lambda: self._on_controller_change(cid)))
        self.enqueue("Startup", self._elect)

    async def shutdown(self) -> None:
        """Stop handling events, resign, and give /controller up for a quick failover."""
        if self._closing:
            return
        self._closing = True
        if self._controller_watch is not None:
            self._controller_watch.cancel()
        if self._event_task is not None:
            self._event_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._event_task
        while not self._queue.empty():
            ev = self._queue.get_nowait()
            if ev.future is not None and not ev.future.done():
                ev.future.set_exception(RuntimeError("controller shut down"))
                ev.future.exception()
        was_active, version = self.is_active, self.epoch_zk_version
        await self._on_resignation()
        if was_active:
            with contextlib.suppress(Exception):
                await self._zk(self.zk_client.resign_controller, version)
        for t in list(self._tasks):
            t.cancel()
        for h in list(self._timers):
            h.cancel()
        self._timers.clear()
        self._zk_thread.shutdown(wait=False)

    # -- the event queue ---------------------------------------------------------------------
    def enqueue(self, name: str, handler: Callable[[], Awaitable[T]]) -> asyncio.Future[T]:
        """Queue an event; the future completes with the handler's result."""
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if self._closing:
            fut.set_exception(RuntimeError("controller shut down"))
            fut.exception()
            return fut
        self._queue.put_nowait(_Event(name, handler, fut))
        return fut

    def _enqueue_threadsafe(self, name: str, handler: Callable[[], Awaitable[Any]]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed() or self._closing:
            return
        loop.call_soon_threadsafe(self._put, _Event(name, handler, None))

    def _put(self, ev: _Event) -> None:
        if not self._closing:
            self._queue.put_nowait(ev)

    async def _process_events(self) -> None:
        while True:
            ev = await self._queue.get()
            started = time.monotonic()
            try:
                result = await ev.handler()
            except ControllerMovedError as e:
                log.info("controller %d: %s while handling %s: resigning", self.broker_id, e,
                         ev.name)
                await self._on_resignation()
                self._set(ev, exc=e)
                continue
            except asyncio.CancelledError:
                self._set(ev, exc=RuntimeError("controller shut down"))
                raise
            except Exception as e:
                log.exception("controller %d: event %s failed", self.broker_id, ev.name)
                self._set(ev, exc=e)
                continue
            took = time.monotonic() - started
            if took >= SLOW_EVENT_S:
                log.info("controller %d: %s took %.1f s (queued %.1f s before)", self.broker_id,
                         ev.name, took, started - ev.queued_at)
            self._set(ev, result=result)

    @staticmethod
    def _set(ev: _Event, result: Any = None, exc: BaseException | None = None) -> None:
        f = ev.future
        if f is None or f.done():
            return
        if exc is not None:
            f.set_exception(exc)
            f.exception()
        else:
            f.set_result(result)

    def _enqueue_later(self, delay_s: float, name: str,
                       handler: Callable[[], Awaitable[Any]]) -> None:
        """Queue an event after a delay (a retry); pending until then, as `wait_idle` sees it."""
        def fire() -> None:
            self._timers.discard(timer)
            if not self._closing:
                self.enqueue(name, handler)

        timer = asyncio.get_running_loop().call_later(delay_s, fire)
        self._timers.add(timer)

    async def wait_idle(self) -> None:
        """Return when the controller has nothing left to do for now: every ZooKeeper change
        its session saw before the call has been handled, with the events and the retries
        that followed, and no request to a broker is queued or awaiting its answer (the
        periodic preferred-leader check aside). A barrier for asserting that something did
        *not* happen."""
        while True:
            await self._zk(self.zk_client.sync_watches)
            # The watches' events are queued now (call_soon_threadsafe keeps their order).
            await self.enqueue("Barrier", _nothing)
            if self._queue.empty() and not self._tasks and not self._timers and (
                    self.channel is None or self.channel.idle):
                return
            await asyncio.sleep(0.01)  # a response or a retry is due: look again

    async def _zk(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(
            self._zk_thread, functools.partial(fn, *args, **kwargs))

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- election ---------------------------------------------------------------------------
    async def _elect(self) -> None:
        if self._closing:
            return
        current = await self._zk(self.zk_client.get_controller_id)
        if current is not None:
            self.active_controller_id = current
            if current != self.broker_id and self.is_active:
                await self._on_resignation()
            return
        election = await self._zk(self.zk_client.try_elect_controller, self.broker_id)
        self.active_controller_id = election.controller_id
        if not election.elected:
            log.info("broker %d: broker %s is the controller (epoch %d)", self.broker_id,
                     election.controller_id, election.controller_epoch)
            return
        self.controller_epoch = election.controller_epoch
        self.epoch_zk_version = election.epoch_zk_version
        self.active_controller_id = self.broker_id
        try:
            await self._on_controller_failover()
        except ControllerMovedError:
            raise
        except Exception:
            # Kafka's triggerControllerMove: give the role up so that another broker tries.
            log.exception("controller %d: failover failed; resigning", self.broker_id)
            await self._on_resignation()
            with contextlib.suppress(Exception):
                await self._zk(self.zk_client.resign_controller, self.epoch_zk_version)

    async def _on_controller_change(self, controller_id: int | None) -> None:
        self.active_controller_id = controller_id
        if controller_id is None:
            await self._reelect()
        elif controller_id != self.broker_id and self.is_active:
            await self._on_resignation()

    async def _reelect(self) -> None:
        if self.is_active:
            current = await self._zk(self.zk_client.get_controller_id)
            if current == self.broker_id:
                return
            await self._on_resignation()
        await self._elect()

    async def _on_session_expired(self) -> None:
        # Our ephemeral /controller is gone with the session: stop acting at once.
        await self._on_resignation()

    async def _on_controller_failover(self) -> None:
        log.info("controller %d: elected, controller epoch %d", self.broker_id,
                 self.controller_epoch)
        core = _TopicAwareCore(
            self.broker_id, self.controller_epoch,
            unclean_leader_election_enable=self._dynamic_unclean
            if self._dynamic_unclean is not None
            else bool(self._cfg("unclean.leader.election.enable", False)))
        brokers, assignments, states, deletions, unclean = await self._zk(self._load_context)
        core.topic_unclean.update(unclean)
        for tp, replicas in sorted(assignments.items()):
            core.add_partition(tp, replicas)
        executor = DecisionExecutor(self.zk_client, core, self.epoch_zk_version,
                                    on_topic_gone=self._forget_topic_partitions)
        await self._zk(executor.load_unclean_marks)
        self.core, self.executor = core, executor
        self.is_active = True
        self.elections_won.append(self.controller_epoch)
        self.channel = ControllerChannelManager(
            self.broker_id,
            socket_timeout_ms=int(self._cfg("controller.socket.timeout.ms", 30000)),
            request_timeout_ms=int(self._cfg("request.timeout.ms", 30000)),
            listener_name=self._inter_broker_listener(),
            leader_epochs=self._leader_epoch_of,
            topic_ids=self.topic_ids,
            on_response=self._on_control_response,
        )
        # The broker-change path of every event (KIP-966 marks of unclean registrations
        # included: a broker that re-registered just before this failover was not seen by the
        # old controller); the failover then loads them as live instead of starting each.
        executor.on_broker_registrations(brokers)
        for b, (info, epoch) in sorted(brokers.items()):
            core.live_brokers[b] = epoch
            self.channel.add_broker(b, info)
        self.topics = {tp.topic for tp in assignments} | set(self._topics_without_partitions)
        for tp, replicas in sorted(assignments.items()):
            s = states.get(tp)
            if s is not None:
                core.refresh_partition(tp, from_zk_state(tp, s, replicas))
        # Kafka's failover: UpdateMetadata to every live broker, naming no partition (each
        # learns this controller, where its leaders send AlterPartition, before its
        # LeaderAndIsr: at 10,000 partitions that takes seconds to apply), LeaderAndIsr with the
        # current state to every live replica (a broker that missed a change catches up) and
        # the UpdateMetadata of every partition, then elect leaders for offline and new ones.
        self._send(core.commit(Decision(update_metadata=True), {}))
        resend = Decision(update_metadata=True)
        for tp, replicas in core.assignments.items():
            if tp in core.partition_states:
                resend.resend[tp] = {r for r in replicas if r in core.live_brokers}
        self._send(core.commit(resend, {}))
        for b in core.offline_brokers():
            await self._carry_out(lambda ex, b=b: ex.broker_failure(b))
        await self._execute(core.initial_leaders)
        # Watches fire at once with the current children: changes since the load are events.
        self._watches = [
            await self._zk(self.zk_client.watch_broker_changes,
                           lambda _ids: self._enqueue_threadsafe("BrokerChange",
                                                                 self._on_broker_change)),
            await self._zk(self.zk_client.watch_topic_changes,
                           lambda _ts: self._enqueue_threadsafe("TopicChange",
                                                                self._on_topic_change)),
            await self._zk(self.zk_client.watch_isr_change_notifications,
                           lambda _s: self._enqueue_threadsafe("IsrChangeNotification",
                                                               self._on_isr_change)),
            await self._zk(self.zk_client.watch_log_dir_event_notifications,
                           lambda _s: self._enqueue_threadsafe("LogDirEventNotification",
                                                               self._on_log_dir_event)),
            await self._zk(self.zk_client.watch_delete_topics,
                           lambda _ts: self._enqueue_threadsafe("TopicDeletion",
                                                                self._on_topic_deletion)),
        ]
        for t in sorted(self.topics):
            await self._watch_partition_modifications(t)
        # Moves in progress resume from the topic znodes and /admin/reassign_partitions.
        await self.reassignments.resume()
        self._watches.append(await self._zk(
            self.zk_client.watch_partition_reassignment,
            lambda exists: self._enqueue_threadsafe(
                "ZkPartitionReassignment",
                lambda: self.reassignments.on_zk_reassignment(exists))))
        if deletions:
            self.enqueue("TopicDeletion", self._on_topic_deletion)
        if self._cfg("auto.leader.rebalance.enable", True):
            interval = float(self._cfg("leader.imbalance.check.interval.seconds", 300))
            self._rebalance_task = asyncio.get_running_loop().create_task(
                self._schedule_rebalance(max(interval, 0.1)))

    def _load_context(self) -> tuple[dict[int, tuple[BrokerInfo, int]],
                                     dict[TopicPartition, tuple[int, ...]],
                                     dict[TopicPartition, LeaderIsrAndControllerEpoch], set[str],
                                     dict[str, bool]]:
        """Every ZooKeeper read of a failover, in one worker-thread call."""
        zk = self.zk_client
        brokers = zk.get_all_brokers_and_epochs()
        assignments: dict[TopicPartition, tuple[int, ...]] = {}
        empty: set[str] = set()
        self.topic_ids.clear()
        for topic in sorted(zk.get_all_topics()):
            a = self._read_topic(topic)
            if not a:
                empty.add(topic)
                continue
            for p, replicas in a.items():
                assignments[TopicPartition(topic, p)] = tuple(replicas)
        self._topics_without_partitions = empty
        states = {TopicPartition(*tp): s
                  for tp, s in zk.get_partition_states(list(assignments)).items()}
        return (brokers, assignments, states, zk.get_topic_deletions(),
                self._read_unclean_overrides({tp.topic for tp in assignments}))

    def _read_topic(self, topic: str) -> dict[int, list[int]] | None:
        """A topic's assignment, its id noted in `topic_ids`. A topic written before topic ids
        gets one now, written back to its znode (as Kafka 2.8+'s controller does) on the
        version read: a partition addition written meanwhile is read again, not overwritten."""

        def read_and_name(data: bytes | None, version: int) -> dict[int, list[int]] | None:
            if data is None:
                return None
            assignment, topic_id = zk_data.decode_topic_znode(topic, data)
            if topic_id is None:
                topic_id = new_topic_id()
                adding, removing = zk_data.decode_topic_reassignments(topic, data)
                self.zk_client.set_topic_assignment(
                    topic, assignment, expected_version=version, topic_id=topic_id,
                    adding=adding, removing=removing,
                    expected_epoch_zk_version=self.epoch_zk_version)
            self.topic_ids[topic] = topic_id
            return assignment

        return rewrite_topic_znode(self.zk_client, topic, read_and_name)

    def _read_unclean_overrides(self, topics: Iterable[str]) -> dict[str, bool]:
        out: dict[str, bool] = {}
        for t in topics:
            v = _unclean_override(self.zk_client.get_topic_config(t))
            if v is not None:
                out[t] = v
        return out

    def _inter_broker_listener(self) -> str:
        try:
            return str(self.config.inter_broker_listener_name)
        except Exception:  # noqa: BLE001
            return "PLAINTEXT"

    def _leader_epoch_of(self, tp: TopicPartition) -> int:
        s = self.core.partition_states.get(tp) if self.core is not None else None
        return s.leader_epoch if s is not None else -1

    async def _on_resignation(self) -> None:
        """Kafka's `onControllerResignation`: unwatch, stop the channel, forget the context."""
        if not self.is_active and self.channel is None:
            return
        log.info("controller %d: resigning (epoch %d)", self.broker_id, self.controller_epoch)
        self.is_active = False
        for w in self._watches:
            w.cancel()
        self._watches = []
        for w in self._partition_watches.values():
            w.cancel()
        self._partition_watches = {}
        if self._rebalance_task is not None:
            self._rebalance_task.cancel()
            self._rebalance_task = None
        channel, self.channel = self.channel, None
        if channel is not None:
            await channel.shutdown()
        self.core = None
        self.executor = None
        self.topics = set()
        self.topics_to_be_deleted = set()
        self._deleting = {}
        self._deletion_assignments = {}
        self._deletion_failures = {}
        self.reassignments.reset()

    # -- carrying out decisions ----------------------------------------------------------------
    def _send(self, requests: dict[int, list[Any]]) -> None:
        if self.channel is not None:
            self.channel.send_all(requests)

    async def _execute(self, event: Callable[[], Decision],
                       refresh: Iterable[TopicPartition] = ()) -> Decision | None:
        """Run `event` through the executor, then send the requests it produced.

        The partitions in `refresh` are re-read from ZooKeeper first: a leader may have changed
        an ISR whose notification has not arrived yet, and a decision taken on the stale state
        may write nothing at all (so no compare-and-set could catch it).
        """
        return await self._carry_out(lambda ex: ex.execute(event, list(refresh)))

    async def _carry_out(self, run: Callable[[DecisionExecutor], Executed | None]
                         ) -> Decision | None:
        """`run(executor)` in a worker thread (it calls ZooKeeper), then send its requests."""
        core, executor = self.core, self.executor
        if core is None or executor is None or not self.is_active:
            return None
        done = await self._zk(run, executor)
        if done is None or self.core is not core:
            return None
        for requests in done.requests:
            self._send(requests)
        return done.decision

    def _forget_topic_partitions(self, topic: str) -> dict[TopicPartition, tuple[int, ...]]:
        core = self.core
        removed: dict[TopicPartition, tuple[int, ...]] = {}
        if core is None:
            return removed
        if isinstance(core, _TopicAwareCore):
            core.topic_unclean.pop(topic, None)
        for tp in [tp for tp in core.assignments if tp.topic == topic]:
            removed[tp] = core.assignments.pop(tp)
            core.partition_states.pop(tp, None)
            core.unclean_restarted.pop(tp, None)
        return removed

    # -- topic config changes ----------------------------------------------------------------
    def on_topic_config_change(self, topic: str, config: Mapping[str, str]) -> None:
        """A topic's overrides changed (the broker's /config/changes listener calls this, as
        Kafka's TopicConfigHandler does): the topic's unclean.leader.election.enable applies to
        its next elections, and turning it on elects leaders for its offline partitions now
        (Kafka's enableTopicUncleanLeaderElection)."""
        if self.core is None or not self.is_active:
            return
        self.enqueue("TopicConfigChange", lambda: self._on_topic_config_change(topic, config))

    def on_default_unclean_change(self, enabled: bool) -> None:
        """The broker's unclean.leader.election.enable in force (a dynamic broker config):
        topics without their own value follow it, and turning it on elects their offline
        partitions now (Kafka's enableDefaultUncleanLeaderElection)."""
        if enabled == self._dynamic_unclean:
            return
        self._dynamic_unclean = enabled
        if self.core is not None and self.is_active:
            self.enqueue("UncleanLeaderElectionEnable", lambda: self._on_default_unclean(enabled))

    async def _on_default_unclean(self, enabled: bool) -> None:
        core = self.core
        if not isinstance(core, _TopicAwareCore) or core.default_unclean == enabled:
            return
        core.default_unclean = core.unclean_leader_election_enable = enabled
        if not enabled:
            return
        topics = {tp.topic for tp in core.partition_states} - set(core.topic_unclean)
        offline = [tp for tp, s in core.partition_states.items()
                   if tp.topic in topics and (s.leader == NO_LEADER
                                              or s.leader not in core.live_brokers)]
        if offline:
            log.info("controller %d: unclean leader election enabled by default: electing %s",
                     self.broker_id, offline)
            await self._execute(lambda: core.elect_offline_leaders(topics), offline)

    async def _on_topic_config_change(self, topic: str, config: Mapping[str, str]) -> None:
        core = self.core
        if not isinstance(core, _TopicAwareCore):
            return
        override = _unclean_override(dict(config))
        if override is None:
            core.topic_unclean.pop(topic, None)
        else:
            core.topic_unclean[topic] = override
        if override:
            offline = [tp for tp, s in core.partition_states.items()
                       if tp.topic == topic and (s.leader == NO_LEADER
                                                 or s.leader not in core.live_brokers)]
            if offline:
                log.info("controller %d: unclean leader election enabled for %s: electing %s",
                         self.broker_id, topic, offline)
                await self._execute(lambda: core.elect_offline_leaders({topic}), offline)

    # -- broker changes --------------------------------------------------------------------------
    async def _on_broker_change(self) -> None:
        core, channel = self.core, self.channel
        if core is None or channel is None:
            return
        executor = self.executor
        if executor is None:
            return
        current = await self._zk(self.zk_client.get_all_brokers_and_epochs)
        changes = executor.on_broker_registrations(current)
        dead, started, bounced = changes.dead, changes.started, changes.bounced
        if changes:
            log.info("controller %d: brokers joined %s, left %s, bounced %s", self.broker_id,
                     started, dead, bounced)
        for b in dead:
            await channel.remove_broker(b)
            await self._carry_out(lambda ex, b=b: ex.broker_failure(b))
        for b in bounced + started:
            info, epoch = current[b]
            if b in bounced:
                # Requests queued for the old incarnation carry its epoch: drop them.
                await channel.remove_broker(b)
            channel.add_broker(b, info)
            await self._carry_out(lambda ex, b=b, e=epoch: ex.broker_startup(b, e))
            await self.reassignments.on_broker_startup(b)
        if started or bounced:
            # Partitions that had no live replica when they were created get their first
            # leader now (Kafka's NewPartition -> OnlinePartition on broker startup).
            if any(tp not in core.partition_states for tp in core.assignments):
                await self._execute(core.initial_leaders)
            if self.topics_to_be_deleted:
                self._deletion_failures.clear()
                await self._resume_deletions()

    # -- topics ------------------------------------------------------------------------------------
    async def _on_topic_change(self) -> None:
        core = self.core
        if core is None:
            return
        topics = await self._zk(self.zk_client.get_all_topics)
        new = sorted(topics - self.topics)
        gone = self.topics - topics
        for t in gone:
            self._forget_topic_partitions(t)
            self.topic_ids.pop(t, None)
            w = self._partition_watches.pop(t, None)
            if w is not None:
                w.cancel()
        self.topics = set(topics)
        if not new:
            return
        assignments = await self._zk(lambda: {t: self._read_topic(t) for t in new})
        if isinstance(core, _TopicAwareCore):
            core.topic_unclean.update(await self._zk(self._read_unclean_overrides, new))
        added = 0
        for t, a in sorted(assignments.items()):
            for p, replicas in sorted((a or {}).items()):
                core.add_partition(TopicPartition(t, p), replicas)
                added += 1
        log.info("controller %d: new topics %s (%d partitions)", self.broker_id, new, added)
        await self._execute(core.initial_leaders)
        for t in new:
            await self._watch_partition_modifications(t)

    async def _watch_partition_modifications(self, topic: str) -> None:
        """Watch the topic's assignment znode; a change (CreatePartitions) is an event."""
        if topic in self._partition_watches:
            return
        self._partition_watches[topic] = await self._zk(
            self.zk_client.watch_topic_assignment, topic,
            lambda _a: self._enqueue_threadsafe(
                "PartitionModifications", lambda: self._on_partition_modifications(topic)))

    async def _on_partition_modifications(self, topic: str) -> None:
        """Kafka's `processPartitionModifications`: partitions in the znode the controller does
        not know yet are new: created like a new topic's (leader = first live replica, ISR = the
        live replicas, LeaderAndIsr + UpdateMetadata). Skipped for a topic being deleted."""
        core = self.core
        if core is None or topic not in self.topics:
            return
        if topic in self.topics_to_be_deleted or topic in self._deletion_assignments:
            log.info("controller %d: skipping adding partitions to %s: it is being deleted",
                     self.broker_id, topic)
            return
        assignment = await self._zk(self.zk_client.get_topic_assignment, topic)
        if self.core is not core or not assignment:
            return
        await self._carry_out(lambda ex: ex.add_partitions(topic, assignment))

    async def _on_isr_change(self) -> None:
        await self._carry_out(DecisionExecutor.on_isr_change_notifications)
        # A moving partition whose ISR now holds its target replicas completes (Kafka's
        # PartitionReassignmentIsrChange).
        await self.reassignments.on_isr_change()

    # -- log dir failures (Kafka's JBOD handling) ---------------------------------------------------
    async def _on_log_dir_event(self) -> None:
        """Kafka's processLogDirEventNotification (DecisionExecutor's, shared with the
        simulator)."""
        await self._carry_out(DecisionExecutor.on_log_dir_event_notifications)

    def _on_control_response(self, broker_id: int, request: Any, response: Any) -> None:
        """A LeaderAndIsr answer is queued as an event (Kafka's LeaderAndIsrResponseReceived)
        only when it matters (`DecisionExecutor.leader_and_isr_response_matters`)."""
        executor = self.executor
        if executor is None or not isinstance(request, LeaderAndIsrRequest):
            return
        if getattr(response, "error_code", 0):
            return  # Kafka logs such an answer and ignores it (the channel logged it)
        # The names of the request's own topics, looked up one by one: the ZooKeeper worker
        # thread may add ids meanwhile, and an iteration over the whole map would then fail.
        ids = self.topic_ids
        errors = leader_and_isr_partition_errors(
            response, {topic_id: s.topic for s in request.partition_states
                       if (topic_id := ids.get(s.topic)) is not None})
        if not executor.leader_and_isr_response_matters(broker_id, errors):
            return
        epoch = request.broker_epoch
        self.enqueue("LeaderAndIsrResponseReceived",
                     lambda: self._carry_out(
                         lambda ex: ex.on_leader_and_isr_response(broker_id, epoch, errors)))

    # -- topic deletion (Kafka's TopicDeletionManager, simplified) ---------------------------------
    async def _on_topic_deletion(self) -> None:
        if self.core is None:
            return
        marked = await self._zk(self.zk_client.get_topic_deletions)
        if not self._cfg("delete.topic.enable", True):
            await self._zk(self.zk_client.delete_topic_deletions, marked, self.epoch_zk_version)
            return
        unknown = {t for t in marked if t not in self.topics and t not in self._deletion_assignments}
        if unknown:
            await self._zk(self.zk_client.delete_topic_deletions, unknown, self.epoch_zk_version)
        self.topics_to_be_deleted |= marked - unknown
        await self._resume_deletions()

    async def _resume_deletions(self) -> None:
        core, channel = self.core, self.channel
        if core is None or channel is None:
            return
        for topic in sorted(self.topics_to_be_deleted - set(self._deleting)):
            if self.reassignments.topic_is_moving(topic):
                # Kafka marks it ineligible for deletion until its moves complete.
                continue
            if topic not in self._deletion_assignments:
                # From now on the topic's partitions are not the controller's to elect.
                self._deletion_assignments[topic] = self._forget_topic_partitions(topic)
            assignment = self._deletion_assignments[topic]
            replicas = {r for rs in assignment.values() for r in rs}
            dead = sorted(r for r in replicas if r not in core.live_brokers)
            if dead:
                log.info("controller %d: deletion of %s waits for brokers %s", self.broker_id,
                         topic, dead)
                continue
            self._deleting[topic] = assignment
            # Clients and brokers first learn the partitions are going (leader -2).
            dying = tuple(
                LeaderAndIsrPartitionState(
                    topic=tp.topic, partition=tp.partition, controller_epoch=core.controller_epoch,
                    leader=LEADER_DURING_DELETE, leader_epoch=-1, isr=(), zk_version=-1,
                    replicas=rs)
                for tp, rs in sorted(assignment.items()))
            live = tuple(sorted(core.live_brokers.items()))
            for b, epoch in live:
                channel.send(b, UpdateMetadataRequest(
                    core.controller_id, core.controller_epoch, epoch, dying, live))
            futures = []
            for b in sorted(replicas):
                tps = tuple(sorted(tp for tp, rs in assignment.items() if b in rs))
                futures.append(channel.send(b, StopReplicaRequest(
                    core.controller_id, core.controller_epoch, core.live_brokers[b], tps, True)))
            self._spawn(self._await_stop_replicas(topic, futures))

    async def _await_stop_replicas(self, topic: str, futures: list[asyncio.Future[Any]]) -> None:
        results = await asyncio.gather(*futures, return_exceptions=True)
        ok = True
        for r in results:
            if isinstance(r, BaseException):
                ok = False
            else:
                errors = [e.error_code for e in getattr(r, "partition_errors", ()) if e.error_code]
                if getattr(r, "error_code", 0) or errors:
                    ok = False
        self.enqueue("TopicDeletionStopReplicaResponseReceived",
                     lambda: self._complete_deletion(topic, ok))

    async def _complete_deletion(self, topic: str, ok: bool) -> None:
        if self.core is None or topic not in self._deleting:
            return
        del self._deleting[topic]
        if not ok:
            failures = self._deletion_failures.get(topic, 0) + 1
            self._deletion_failures[topic] = failures
            if failures <= MAX_DELETION_RETRIES:
                log.info("controller %d: a replica of %s did not stop; retrying the deletion",
                         self.broker_id, topic)
                self._enqueue_later(min(DELETION_RETRY_BACKOFF_S * failures, 1.0),
                                    "TopicDeletionRetry", self._resume_deletions)
            else:
                # Kafka marks the topic ineligible: retried when a broker (re)starts.
                log.warning("controller %d: deletion of %s failed %d times; it resumes when a "
                            "broker starts", self.broker_id, topic, failures)
            return
        self._deletion_failures.pop(topic, None)
        await self._zk(self.zk_client.delete_topic_znodes, topic, self.epoch_zk_version)
        await self._zk(self.zk_client.delete_topic_deletions, [topic], self.epoch_zk_version)
        self.topics.discard(topic)
        self.topic_ids.pop(topic, None)
        self.topics_to_be_deleted.discard(topic)
        self._deletion_assignments.pop(topic, None)
        w = self._partition_watches.pop(topic, None)
        if w is not None:
            w.cancel()
        log.info("controller %d: deleted topic %s", self.broker_id, topic)

    # -- controlled shutdown -----------------------------------------------------------------------
    async def controlled_shutdown(self, broker_id: int,
                                  broker_epoch: int = -1) -> tuple[int, list[TopicPartition]]:
        """Handle a broker's ControlledShutdown request: (error code, partitions it still leads).

        The broker repeats the request until no partition remains (Kafka's
        `controlled.shutdown.max.retries`). Answered NOT_CONTROLLER on a non-controller.
        """
        if not self.is_active:
            return int(ErrorCode.NOT_CONTROLLER), []
        try:
            return await self.enqueue(
                "ControlledShutdown", lambda: self._on_controlled_shutdown(broker_id, broker_epoch))
        except ControllerMovedError:
            return int(ErrorCode.NOT_CONTROLLER), []

    async def _on_controlled_shutdown(self, broker_id: int,
                                      broker_epoch: int) -> tuple[int, list[TopicPartition]]:
        core = self.core
        if core is None:
            return int(ErrorCode.NOT_CONTROLLER), []
        cached = core.live_brokers.get(broker_id)
        if cached is None:
            return int(ErrorCode.BROKER_NOT_AVAILABLE), []
        if broker_epoch >= 0 and broker_epoch < cached:
            return int(ErrorCode.STALE_BROKER_EPOCH), []
        log.info("controller %d: controlled shutdown of broker %d", self.broker_id, broker_id)
        await self._carry_out(lambda ex: ex.execute(lambda: core.controlled_shutdown(broker_id),
                                                    ex.partitions_of(broker_id)))
        remaining = sorted(
            tp for tp, s in core.partition_states.items()
            if s.leader == broker_id and len(core.assignments.get(tp, ())) > 1)
        return int(ErrorCode.NONE), remaining

    # -- AlterPartition (KIP-497) ------------------------------------------------------------------
    async def alter_partition(self, broker_id: int, broker_epoch: int,
                              proposals: list[ProposeIsr]) -> AlterPartitionOutcome | None:
        """A leader's AlterPartition, one event (Kafka's AlterPartitionReceived): checked,
        written and UpdateMetadata sent by `DecisionExecutor.alter_partition`. None: not the
        active controller (NOT_CONTROLLER)."""
        if not self.is_active:
            return None
        try:
            return await self.enqueue(
                "AlterPartitionReceived",
                lambda: self._on_alter_partition(broker_id, broker_epoch, proposals))
        except ControllerMovedError:
            return None

    async def _on_alter_partition(self, broker_id: int, broker_epoch: int,
                                  proposals: list[ProposeIsr]) -> AlterPartitionOutcome | None:
        core, executor = self.core, self.executor
        if core is None or executor is None or not self.is_active:
            return None
        outcome = await self._zk(executor.alter_partition, broker_id, broker_epoch, proposals)
        if self.core is not core:
            return None
        for requests in outcome.executed.requests:
            self._send(requests)
        if any(tp in self.reassignments.reassigning for tp in outcome.written):
            # After the answer, as Kafka's maybeCompleteReassignment: a moving partition whose
            # ISR now holds its target replicas completes.
            self.enqueue("PartitionReassignmentIsrChange", self.reassignments.on_isr_change)
        return outcome

    # -- preferred leaders -------------------------------------------------------------------------
    async def elect_preferred_leaders(self) -> int:
        """Move every partition whose preferred replica can lead back to it; returns how many."""
        return await self.enqueue("PreferredReplicaLeaderElection",
                                  lambda: self._elect_preferred(None))

    async def elect_leaders(self, partitions: Iterable[TopicPartition] | None,
                            election_type: int) -> dict[TopicPartition, tuple[int, str | None, int]]:
        """An admin's ElectLeaders (Kafka's `electLeaders`, ZooKeeper mode): (error, message,
        the leader elected) per partition; None: every partition. NOT_CONTROLLER for each when
        this broker is not the active controller."""
        asked = None if partitions is None else list(dict.fromkeys(partitions))
        not_controller = {tp: (int(ErrorCode.NOT_CONTROLLER), None, -1) for tp in asked or ()}
        if not self.is_active:
            return not_controller
        try:
            return await self.enqueue("ReplicaLeaderElection",
                                      lambda: self._on_elect_leaders(asked, election_type))
        except ControllerMovedError:
            return not_controller

    async def _on_elect_leaders(self, partitions: list[TopicPartition] | None,
                                election_type: int
                                ) -> dict[TopicPartition, tuple[int, str | None, int]]:
        core = self.core
        if core is None:
            return {tp: (int(ErrorCode.NOT_CONTROLLER), None, -1) for tp in partitions or ()}
        if partitions is None:
            partitions = sorted(core.assignments)
        out: dict[TopicPartition, tuple[int, str | None, int]] = {}
        known: list[TopicPartition] = []
        for tp in partitions:
            if tp.topic in self.topics_to_be_deleted and tp in self._deletion_assignments.get(
                    tp.topic, {}):
                out[tp] = (int(ErrorCode.INVALID_TOPIC_EXCEPTION), "The topic is being deleted",
                           -1)
            else:
                known.append(tp)
        outcome: dict[TopicPartition, tuple[int, str | None, int]] = {}

        def run(ex: DecisionExecutor) -> Executed:
            done, results = ex.elect_leaders(known, election_type)
            outcome.update(results)
            return done

        await self._carry_out(run)
        out.update(outcome)
        if self.core is not core:
            return {tp: (int(ErrorCode.NOT_CONTROLLER), None, -1) for tp in partitions}
        return out

    async def _schedule_rebalance(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.enqueue("AutoPreferredReplicaLeaderElection", self._check_imbalance)

    def imbalanced_brokers(self) -> set[int]:
        """Brokers whose share of not-led preferred partitions exceeds
        `leader.imbalance.per.broker.percentage` (Kafka's checkAndTriggerAutoLeaderRebalance)."""
        core = self.core
        if core is None:
            return set()
        pct = float(self._cfg("leader.imbalance.per.broker.percentage", 10))
        out: set[int] = set()
        for b in core.live_brokers:
            if b in core.shutting_down:
                continue
            preferred = [tp for tp, rs in core.assignments.items() if rs and rs[0] == b]
            if not preferred:
                continue
            not_led = [tp for tp in preferred
                       if tp in core.partition_states and core.partition_states[tp].leader != b]
            if len(not_led) / len(preferred) > pct / 100:
                out.add(b)
        return out

    async def _check_imbalance(self) -> int:
        imbalanced = self.imbalanced_brokers()
        if not imbalanced:
            return 0
        return await self._elect_preferred(imbalanced)

    async def _elect_preferred(self, brokers: set[int] | None) -> int:
        core = self.core
        if core is None:
            return 0

        def event() -> Decision:
            d = core.elect_preferred_leaders()
            if brokers is not None:
                d.writes = [w for w in d.writes if core.assignments[w.tp][0] in brokers]
            return d

        decision = await self._execute(event, sorted(core.partition_states))
        return len(decision.writes) if decision is not None else 0

    # -- introspection ---------------------------------------------------------------------------
    def partition_state(self, tp: TopicPartition) -> LeaderAndIsrPartitionState | None:
        return self.core.partition_states.get(tp) if self.core is not None else None

    def __repr__(self) -> str:
        role = "active" if self.is_active else f"standby (controller {self.active_controller_id})"
        return f"<KafkaController broker={self.broker_id} {role} epoch={self.controller_epoch}>"
