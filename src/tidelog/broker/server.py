"""`BrokerServer`: one tidelog broker process (Kafka's `KafkaServer`, ZooKeeper mode).

Start-up, in Kafka's order: ZooKeeper session -> cluster id -> broker id (generated from
`/brokers/seqid` when `broker.id=-1`) -> `LogManager` (load + recovery; the HW checkpoints are
read with it) -> replica manager -> socket servers (one per listener; port 0 binds a free port
and that port is advertised) -> registration `/brokers/ids/<id>` (its czxid is the broker epoch)
-> scheduled tasks and the group coordinator -> the controller, if a factory was given.

Shutdown: controlled shutdown first (when `controlled.shutdown.enable`: find the controller in
ZooKeeper and ask it, over the wire, to move leadership off this broker; up to
`controlled.shutdown.max.retries` attempts, `controlled.shutdown.retry.backoff.ms` apart, as
Kafka's `KafkaServer.controlledShutdown`), then stop accepting, stop the controller and the
fetchers, close connections, checkpoint HWs, close the logs with the clean-shutdown marker, and
deregister from ZooKeeper. Stopping always finishes: a ZooKeeper request not answered within the
client's request timeout (zookeeper.connection.timeout.ms) fails that step, and the session is
closed at the end whatever happened (which also ends any ZooKeeper call still waiting).

The controller hook: `controller_factory(config, zk_client, broker_id)` returns an object with
`async startup()`, `async shutdown()`, `is_active: bool` and
`async controlled_shutdown(broker_id, broker_epoch) -> (error_code, [(topic, partition), ...])`
(the partitions still led by that broker), and optionally `on_topic_config_change(topic,
overrides)` (called after this broker applied a topic's new config) and
`on_default_unclean_change(enabled)` (its dynamic unclean.leader.election.enable). ControlledShutdown requests are routed to it; the
controller talks to brokers (LeaderAndIsr / UpdateMetadata / StopReplica) over the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import socket
from collections.abc import Callable, Iterable
from typing import Any

from tidelog.broker.admin_apis import AdminApis
from tidelog.broker.config import KafkaConfig
from tidelog.broker.config_apis import ConfigApis, ConfigChangeNotifications
from tidelog.broker.dynamic_config import (
    CLEANER_KEYS,
    CONNECTION_KEYS,
    DYNAMIC_DEFAULT,
    DynamicBrokerConfig,
)
from tidelog.broker.group_apis import GroupApis
from tidelog.broker.kafka_apis import KafkaApis
from tidelog.broker.log_cleaner import LogCleaner, cleaner_config_from
from tidelog.broker.metadata_cache import MetadataCache
from tidelog.broker.producer_id_manager import ProducerIdManager
from tidelog.broker.replica_manager import BrokerReplicaManager, now_ms
from tidelog.broker.replication_events import EVENTS_TOPIC, ReplicationEventPublisher
from tidelog.broker.socket_server import SENDFILE_MIN_BYTES, RequestContext, SocketServer
from tidelog.broker.txn_apis import TxnApis
from tidelog.controller.admin import AdminZkClient
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.controller.zk_data import BrokerInfo
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.replication_quota import ReplicationQuotas
from tidelog.storage.file_io import FileIO, OsFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager

__all__ = ["BrokerServer", "replication_config_from"]

logger = logging.getLogger(__name__)

ControllerFactory = Callable[[KafkaConfig, KafkaZkClient, int], Any]

_REPLICATION_KEYS = (
    "replica.lag.time.max.ms", "replica.lag.max.messages",
    "unclean.leader.election.enable", "replica.fetch.backoff.ms", "replica.fetch.max.bytes",
    "replica.fetch.response.max.bytes", "replica.fetch.wait.max.ms", "replica.fetch.min.bytes",
    "replica.socket.timeout.ms",
)


def replication_config_from(config: KafkaConfig) -> ReplicationConfig:
    props = {k: config.get(k) for k in _REPLICATION_KEYS if config.get(k) is not None}
    return ReplicationConfig.from_properties(props)


class BrokerServer:
    def __init__(
        self, config: KafkaConfig, controller_factory: ControllerFactory | None = None,
        file_io: FileIO | None = None,
    ) -> None:
        """``file_io``: the disk the logs live on (default: real files; a test may wrap it to
        make one log dir fail)."""
        self.config = config
        self.file_io: FileIO = file_io or OsFileIO()
        self.controller_factory = controller_factory
        self.broker_id: int = config.get("broker.id")
        self.cluster_id: str | None = None
        self.zk_client: KafkaZkClient = None  # type: ignore[assignment]
        self.admin: AdminZkClient = None  # type: ignore[assignment]
        self.log_manager: LogManager = None  # type: ignore[assignment]
        self.replica_manager: BrokerReplicaManager = None  # type: ignore[assignment]
        self.log_cleaner: LogCleaner | None = None
        self.metadata_cache: MetadataCache = None  # type: ignore[assignment]
        self.producer_id_manager: ProducerIdManager = None  # type: ignore[assignment]
        self.apis: KafkaApis = None  # type: ignore[assignment]
        self.group_apis: GroupApis | None = None
        self.txn_apis: TxnApis | None = None
        self.controller: Any = None
        self.socket_servers: dict[str, SocketServer] = {}
        self.bound_ports: dict[str, int] = {}
        self.inter_broker_listener_name: str = config.inter_broker_listener_name
        self._registered = False
        self._started = False
        self._stopping = False
        self._shutdown_done = asyncio.Event()
        self._topic_configs_checked: set[str] = set()
        # /config/brokers: the dynamic log defaults in force over server.properties
        self.dynamic_config = DynamicBrokerConfig(config)
        # Replication throttles, from the dynamic broker configs and the topics' overrides.
        self.replication_quotas = ReplicationQuotas(
            self.broker_id, config.get("replication.quota.window.num"),
            config.get("replication.quota.window.size.seconds") * 1000,
            config.get("alter.log.dirs.replication.quota.window.num"),
            config.get("alter.log.dirs.replication.quota.window.size.seconds") * 1000)
        self._topic_overrides: dict[str, dict[str, str]] = {}  # /config/topics, as read
        self._config_changes = ConfigChangeNotifications()
        self._config_watch: Any = None
        self._config_lock = asyncio.Lock()
        self._config_tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ properties
    @property
    def broker_epoch(self) -> int:
        return self.replica_manager.broker_epoch if self.replica_manager is not None else -1

    @property
    def port(self) -> int:
        """The bound port of the inter-broker listener (the first listener otherwise)."""
        if self.inter_broker_listener_name in self.bound_ports:
            return self.bound_ports[self.inter_broker_listener_name]
        return next(iter(self.bound_ports.values()))

    @property
    def advertised_endpoint(self) -> tuple[str, int]:
        """This broker's advertised (host, port) on the inter-broker listener."""
        return self.advertised_endpoint_for(self.inter_broker_listener_name)

    def advertised_endpoint_for(self, listener_name: str) -> tuple[str, int]:
        advertised = self._advertised()
        for ep in advertised:
            if ep.listener_name == listener_name:
                return ep.host, ep.port
        return advertised[0].host, advertised[0].port

    def _advertised(self) -> list[Any]:
        out = []
        for ep in self.config.advertised_listeners:
            port = ep.port or self.bound_ports.get(ep.listener_name, 0)
            host = ep.host or socket.getfqdn()
            out.append(type(ep)(ep.listener_name, host, port, ep.security_protocol)
                       if (port != ep.port or host != ep.host) else ep)
        return out

    def endpoint_of(self, broker_id: int) -> tuple[str, int] | None:
        """Where to reach a broker (for the replica fetchers)."""
        if broker_id == self.broker_id:
            return self.advertised_endpoint
        ep = self.metadata_cache.endpoint(broker_id) if self.metadata_cache else None
        return (ep.host, ep.port) if ep is not None else None

    # ------------------------------------------------------------------ startup
    async def startup(self) -> None:
        if self._started:
            return
        self._loop = asyncio.get_running_loop()
        cfg = self.config
        self.zk_client = KafkaZkClient.from_config(cfg)
        await asyncio.to_thread(self.zk_client.start)
        try:
            await self._startup_after_zk()
        except BaseException:
            await self._abort_startup()
            raise
        self._started = True

    async def _startup_after_zk(self) -> None:
        cfg = self.config
        zk = self.zk_client
        self.cluster_id = await asyncio.to_thread(zk.get_or_create_cluster_id)
        if self.broker_id < 0:
            self.broker_id = await asyncio.to_thread(
                zk.generate_broker_id, cfg.get("reserved.broker.max.id"))
        self.admin = AdminZkClient(zk)
        self.producer_id_manager = ProducerIdManager(self.broker_id, zk)
        await self._load_dynamic_config()
        base = LogConfig.from_dict(self.dynamic_config.current.log_config())
        topic_configs = await asyncio.to_thread(self._read_topic_configs, base)
        self.log_manager = await asyncio.to_thread(
            LogManager, cfg.log_dirs, base, self.file_io, now_ms(), topic_configs,
            producer_id_expiration_ms=self.dynamic_config.current.get("producer.id.expiration.ms"))
        if set(self.log_manager.log_dirs) <= self.log_manager.offline_dirs:
            # Kafka shuts down when no log dir is usable.
            raise RuntimeError(f"no usable log directory among {', '.join(cfg.log_dirs)}")
        self.metadata_cache = MetadataCache(self.broker_id, self.inter_broker_listener_name)
        self.replica_manager = BrokerReplicaManager(
            self.broker_id, self.log_manager, replication_config_from(cfg).with_(
                leader_quota=self.replication_quotas.leader,
                follower_quota=self.replication_quotas.follower,
                zero_copy_min_bytes=SENDFILE_MIN_BYTES),
            zk_client=zk, endpoint_of=self.endpoint_of,
            topic_id_of=lambda topic: self.metadata_cache.hosted_topic_id(topic),
            controller_id=lambda: self.metadata_cache.controller_id,
            controller_socket_timeout_ms=cfg.get("controller.socket.timeout.ms"),
            num_replica_fetchers=self.dynamic_config.current.get("num.replica.fetchers"),
            high_watermark_checkpoint_interval_ms=cfg.get("replica.high.watermark.checkpoint.interval.ms"),
            log_retention_check_interval_ms=cfg.get("log.retention.check.interval.ms"),
            log_flush_scheduler_interval_ms=cfg.get("log.flush.scheduler.interval.ms"),
            recovery_point_checkpoint_interval_ms=cfg.get("log.flush.offset.checkpoint.interval.ms") or 60_000,
            log_initial_task_delay_ms=cfg.get("log.initial.task.delay.ms"),
        )
        # replica.alter.log.dirs.io.max.bytes.per.second bounds the copies between log dirs.
        self.replica_manager.shell.alter_log_dirs_manager.quota = \
            self.replication_quotas.alter_log_dirs
        self.apis = KafkaApis(self)
        self.group_apis = GroupApis(self)  # the group coordinator's APIs (register_handler)
        self.group_apis.register(self.apis)
        self.txn_apis = TxnApis(self)  # the transaction coordinator's (wraps some group APIs)
        self.txn_apis.register(self.apis)
        ConfigApis(self).register(self.apis)  # AlterConfigs, IncrementalAlterConfigs
        AdminApis(self).register(self.apis)  # CreatePartitions, DeleteRecords, ... (issue 14)
        for ep in cfg.listeners:
            server = SocketServer(
                ep.host, ep.port, self._handle,
                max_request_bytes=cfg.get("socket.request.max.bytes"),
                connections_max_idle_ms=cfg.get("connections.max.idle.ms"),
                max_connections=self.dynamic_config.current.get("max.connections"),
                max_connections_per_ip=self.dynamic_config.current.get("max.connections.per.ip"),
                send_buffer_bytes=cfg.get("socket.send.buffer.bytes"),
                receive_buffer_bytes=cfg.get("socket.receive.buffer.bytes"),
                listener_name=ep.listener_name,
            )
            self.bound_ports[ep.listener_name] = await server.start()
            self.socket_servers[ep.listener_name] = server
            logger.info("broker %d listening on %s:%d (%s)", self.broker_id, ep.host or "*",
                        self.bound_ports[ep.listener_name], ep.listener_name)
        # KIP-966: a broker back from an unclean shutdown may have lost its unflushed tail; the
        # controller keeps it from being a clean leader candidate until it has caught up. Log dirs
        # holding no log yet have nothing to lose.
        clean = all(self.log_manager.had_clean_shutdown.values()) or not self.log_manager.all_logs()
        info = BrokerInfo.from_endpoints(self.broker_id, self._advertised(), cfg.get("broker.rack"),
                                         clean_shutdown=clean)
        epoch = await asyncio.to_thread(zk.register_broker, info)
        self._registered = True
        self.replica_manager.set_broker_epoch(epoch)
        loop = asyncio.get_running_loop()
        zk.on_new_session(lambda e: loop.call_soon_threadsafe(self._on_new_session, e))
        self._config_watch = await asyncio.to_thread(
            zk.watch_config_changes,
            lambda names: loop.call_soon_threadsafe(self._on_config_changes, names))
        self.replica_manager.start()
        self.log_cleaner = LogCleaner(self.log_manager,
                                      cleaner_config_from(self.dynamic_config.current))
        self.log_cleaner.start()
        if cfg.get("tidelog.replication.events.enable"):
            self.replica_manager.events = self._event_publisher()
            self.replica_manager.events.start()
        if self.controller_factory is not None:
            self.controller = self.controller_factory(cfg, zk, self.broker_id)
            self._notify_controller_of_defaults()
            result = self.controller.startup()
            if inspect.isawaitable(result):
                await result
        logger.info("broker %d started (broker epoch %d, cluster %s)", self.broker_id, epoch,
                    self.cluster_id)

    def _event_publisher(self) -> ReplicationEventPublisher:
        def create_topic(replication_factor: int) -> None:
            self.admin.create_topic(EVENTS_TOPIC, 1, replication_factor)

        def bootstrap() -> str:
            host, port = self.advertised_endpoint
            return f"{host}:{port}"

        return ReplicationEventPublisher(
            self.broker_id, bootstrap, create_topic=create_topic,
            live_brokers=lambda: len(self.zk_client.get_all_broker_ids()))

    def _read_topic_configs(self, base: LogConfig) -> dict[str, LogConfig]:
        out: dict[str, LogConfig] = {}
        for topic in self.zk_client.get_all_topics():
            overrides = self.zk_client.get_topic_config(topic)
            self._topic_configs_checked.add(topic)
            self._topic_overrides[topic] = overrides
            self.replication_quotas.update_topic(topic, overrides)
            if overrides:
                try:
                    out[topic] = LogConfig.from_dict(overrides, base)
                except ValueError as e:
                    logger.warning("topic %s: ignoring invalid config overrides: %s", topic, e)
        return out

    async def ensure_topic_configs(self, topics: set[str]) -> None:
        """Before a partition's log is created here, load its topic's config overrides."""
        new = [t for t in topics if t not in self._topic_configs_checked]
        for topic in new:
            try:
                overrides = await asyncio.to_thread(self.zk_client.get_topic_config, topic)
            except Exception as e:
                logger.warning("reading the config of topic %s failed: %s", topic, e)
                continue
            self._topic_configs_checked.add(topic)
            self._topic_overrides[topic] = overrides
            self.replication_quotas.update_topic(topic, overrides)
            if overrides:
                try:
                    self.log_manager.topic_configs[topic] = LogConfig.from_dict(
                        overrides, self.log_manager.config)
                except ValueError as e:
                    logger.warning("topic %s: ignoring invalid config overrides: %s", topic, e)

    # ------------------------------------------------------------------ live config changes
    def _on_config_changes(self, names: list[str]) -> None:
        new = self._config_changes.new(names)
        if names and not self._stopping:
            task = asyncio.get_running_loop().create_task(self._apply_config_changes(new, names))
            self._config_tasks.add(task)
            task.add_done_callback(self._config_tasks.discard)

    async def _apply_config_changes(self, names: list[str], present: list[str]) -> None:
        """Kafka's TopicConfigHandler: reload each notified topic's overrides and hand its logs
        the new config (partitions read min.insync.replicas from it at once); then purge the
        notifications `present` that have expired, as Kafka's listener does."""
        async with self._config_lock:  # notifications apply in order
            await self._apply_config_change_notifications(names)
            try:
                await asyncio.to_thread(self.zk_client.purge_obsolete_config_changes, present,
                                        now_ms(), self._config_changes.expiration_ms)
            except Exception as e:  # noqa: BLE001 - the next round purges them
                logger.warning("expired config change notifications not purged: %s", e)

    async def _apply_config_change_notifications(self, names: list[str]) -> None:
        for name in names:
            try:
                entity = await asyncio.to_thread(self.zk_client.get_config_change, name)
                if entity in (f"brokers/{DYNAMIC_DEFAULT}", f"brokers/{self.broker_id}"):
                    before = self.dynamic_config.current
                    await self._load_dynamic_config()
                    self._rebase_logs()
                    await self._reconfigure(before, self.dynamic_config.current)
                    self._notify_controller_of_defaults()
                    continue
                if entity is None or not entity.startswith("topics/"):
                    continue
                topic = entity[len("topics/"):]
                overrides = await asyncio.to_thread(self.zk_client.get_topic_config, topic)
                config = LogConfig.from_dict(overrides, self.log_manager.config)
            except Exception as e:  # noqa: BLE001 - one bad notification stops no other
                logger.warning("config change %s not applied: %s", name, e)
                continue
            self.log_manager.update_topic_config(topic, config)
            self._topic_configs_checked.add(topic)
            self._topic_overrides[topic] = overrides
            self.replication_quotas.update_topic(topic, overrides)
            logger.info("topic %s: configuration changed to %s", topic, overrides)
            notify = getattr(self.controller, "on_topic_config_change", None)
            if notify is not None:  # the active controller's per-topic election rules
                notify(topic, overrides)

    async def _load_dynamic_config(self) -> None:
        """Read /config/brokers/<default> and /config/brokers/<id> into `dynamic_config` (an
        invalid combination stored by another tool is logged and left out)."""
        zk = self.zk_client
        default = await asyncio.to_thread(zk.get_broker_config, DYNAMIC_DEFAULT)
        mine = await asyncio.to_thread(zk.get_broker_config, str(self.broker_id))
        try:
            self.dynamic_config.update(default, mine)
        except ValueError as e:
            logger.warning("dynamic broker configs not applied: %s", e)
        self.replication_quotas.update_rates(default, mine)

    async def _reconfigure(self, old: KafkaConfig, new: KafkaConfig) -> None:
        """Kafka's BrokerReconfigurables, for the dynamic keys tidelog applies beyond the log
        defaults: the connection limits (the next accept), producer.id.expiration.ms (every
        log's producer state), num.replica.fetchers (the fetchers re-partitioned) and the log
        cleaner's keys (the cleaner restarts with them)."""
        def changed(keys: Iterable[str]) -> bool:
            return any(old.get(k) != new.get(k) for k in keys)

        if changed(CONNECTION_KEYS):
            for server in self.socket_servers.values():
                server.max_connections = new.get("max.connections")
                server.max_connections_per_ip = new.get("max.connections.per.ip")
        if changed(["num.replica.fetchers"]):
            self.replica_manager.fetcher_manager.resize(new.get("num.replica.fetchers"))
        expiration = "producer.id.expiration.ms"
        if changed([expiration]):
            self.log_manager.producer_id_expiration_ms = new.get(expiration)
            for log in list(self.log_manager.logs.values()):
                log.producer_state_manager.producer_id_expiration_ms = new.get(expiration)
        if changed([*CLEANER_KEYS, expiration]) and self.log_cleaner is not None:
            await self.log_cleaner.shutdown()
            self.log_cleaner = LogCleaner(self.log_manager, cleaner_config_from(new))
            self.log_cleaner.start()

    def _notify_controller_of_defaults(self) -> None:
        """The controller's default election rule follows this broker's dynamic
        unclean.leader.election.enable (Kafka's controller reads its broker's config)."""
        notify = getattr(self.controller, "on_default_unclean_change", None)
        if notify is not None:
            notify(bool(self.dynamic_config.current.get("unclean.leader.election.enable")))

    def _rebase_logs(self) -> None:
        """The log defaults changed (a dynamic broker config): every topic's config is its
        overrides over the new defaults, from the next append, roll or retention check."""
        lm = self.log_manager
        base = LogConfig.from_dict(self.dynamic_config.current.log_config())
        lm.config = base
        for topic, overrides in self._topic_overrides.items():
            if overrides:
                try:
                    lm.topic_configs[topic] = LogConfig.from_dict(overrides, base)
                except ValueError as e:
                    logger.warning("topic %s: overrides over the new defaults: %s", topic, e)
        for (topic, _), log in list(lm.logs.items()):
            log.update_config(lm.config_for(topic))
        logger.info("broker %d: dynamic configs in force: %s", self.broker_id,
                    {**self.dynamic_config.cluster_default, **self.dynamic_config.per_broker})

    def _on_new_session(self, broker_epoch: int) -> None:
        if broker_epoch >= 0 and self.replica_manager is not None:
            logger.info("broker %d re-registered after a ZooKeeper session expiry: epoch %d",
                        self.broker_id, broker_epoch)
            self.replica_manager.set_broker_epoch(broker_epoch)

    async def _abort_startup(self) -> None:
        for server in self.socket_servers.values():
            with contextlib.suppress(Exception):
                await server.shutdown(grace_s=0.1)
        if self.replica_manager is not None:
            with contextlib.suppress(Exception):
                await self.replica_manager.shutdown()
        if self.log_cleaner is not None:
            with contextlib.suppress(Exception):
                await self.log_cleaner.shutdown()
        if self.log_manager is not None:
            with contextlib.suppress(Exception):
                self.log_manager.shutdown()
        if self.zk_client is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.zk_client.close)

    async def _handle(self, ctx: RequestContext, request: Any) -> Any:
        return await self.apis.handle(ctx, request)

    # ------------------------------------------------------------------ shutdown
    async def controlled_shutdown(self) -> bool:
        """Ask the active controller to move leadership off this broker (Kafka's
        `KafkaServer.controlledShutdown`); True when it reports nothing left."""
        from tidelog.client.connection import BrokerConnection
        from tidelog.protocol.messages.controlled_shutdown import ControlledShutdownRequest

        retries = self.config.get("controlled.shutdown.max.retries")
        backoff_s = self.config.get("controlled.shutdown.retry.backoff.ms") / 1000
        for attempt in range(max(1, retries)):
            try:
                controller_id = await self._zk_bounded(self.zk_client.get_controller_id)
                endpoint = (await self._controller_endpoint(controller_id)
                            if controller_id is not None else None)
            except Exception as e:  # ZooKeeper unreachable: this attempt failed, as in Kafka
                logger.info("controlled shutdown attempt %d: cannot find the controller: %s",
                            attempt + 1, str(e) or type(e).__name__)
                endpoint = None
            else:
                if endpoint is None:
                    logger.info("controlled shutdown attempt %d: no controller registered",
                                attempt + 1)
            if endpoint is not None:
                conn = BrokerConnection(endpoint[0], endpoint[1], client_id=f"broker-{self.broker_id}",
                                        request_timeout_ms=self.config.get("controller.socket.timeout.ms"))
                try:
                    await conn.connect(timeout_s=5)
                    resp = await conn.send(ControlledShutdownRequest(self.broker_id, self.broker_epoch))
                    if resp.error_code == 0 and not resp.remaining_partitions:
                        logger.info("controlled shutdown of broker %d succeeded", self.broker_id)
                        return True
                    logger.info("controlled shutdown attempt %d: error %d, %d partitions remain",
                                attempt + 1, resp.error_code, len(resp.remaining_partitions))
                except Exception as e:
                    logger.info("controlled shutdown attempt %d failed: %s", attempt + 1, e)
                finally:
                    await conn.close()
            if attempt + 1 < retries:
                await asyncio.sleep(backoff_s)
        logger.warning("controlled shutdown of broker %d failed after %d attempt(s); shutting "
                       "down locally", self.broker_id, max(1, retries))
        return False

    async def _zk_bounded(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A ZooKeeper call from the shutdown path, given up after the client's request timeout:
        kazoo waits for a reconnection without bound, closing the session ends the wait."""
        return await asyncio.wait_for(asyncio.to_thread(fn, *args),
                                      self.zk_client.request_timeout_s)

    async def _controller_endpoint(self, controller_id: int) -> tuple[str, int] | None:
        local = self.endpoint_of(controller_id)
        if local is not None:
            return local
        found = await self._zk_bounded(self.zk_client.get_broker, controller_id)
        if found is None:
            return None
        ep = found[0].endpoint(self.inter_broker_listener_name) or (
            found[0].endpoints[0] if found[0].endpoints else None)
        return (ep.host, ep.port) if ep is not None else None

    async def shutdown(self) -> None:
        if self._stopping:
            await self._shutdown_done.wait()
            return
        self._stopping = True
        if self._config_watch is not None:
            self._config_watch.cancel()
        for task in list(self._config_tasks):
            task.cancel()
        try:
            if self._started and self._registered and self.config.get("controlled.shutdown.enable"):
                try:
                    await self.controlled_shutdown()
                except Exception as e:
                    logger.warning("controlled shutdown failed: %s", e)
            for server in self.socket_servers.values():
                server.stop_accepting()
            if self.controller is not None:
                try:
                    result = self.controller.shutdown()
                    if inspect.isawaitable(result):
                        # Its resignation writes to ZooKeeper: bounded like any shutdown step.
                        await asyncio.wait_for(result, self.zk_client.request_timeout_s)
                except Exception as e:
                    logger.warning("controller shutdown failed: %s", str(e) or type(e).__name__)
            if self.txn_apis is not None:
                await self.txn_apis.shutdown()
            if self.group_apis is not None:
                await self.group_apis.shutdown()
            if self.replica_manager is not None and self.replica_manager.events is not None:
                await self.replica_manager.events.shutdown()
            if self.replica_manager is not None:
                await self.replica_manager.shutdown()
            if self.log_cleaner is not None:
                await self.log_cleaner.shutdown()
            for server in self.socket_servers.values():
                await server.shutdown(grace_s=1.0)
            if self.log_manager is not None:
                # Writes the HW, recovery point and log start checkpoints, then the marker.
                await asyncio.to_thread(self.log_manager.shutdown)
            if self.zk_client is not None:
                with contextlib.suppress(Exception):
                    if self._registered:
                        await self._zk_bounded(self.zk_client.deregister_broker)
                await asyncio.to_thread(self.zk_client.close)
            logger.info("broker %d shut down", self.broker_id)
        finally:
            self._shutdown_done.set()

    async def wait_for_shutdown(self) -> None:
        await self._shutdown_done.wait()
