"""AlterConfigs (33) and IncrementalAlterConfigs (44), as Kafka's ZooKeeper-mode broker answers
them (`ZkAdminManager.alterConfigs` / `incrementalAlterConfigs`): any broker validates the
request and writes ZooKeeper; every broker then applies the change it is notified of.

Topics: the new overrides are validated as a whole (`LogConfig.from_dict`) and written to
`/config/topics/<t>` with a `/config/changes/config_change_<seq>` notification (unless
`validate_only`). Errors are Kafka 3.9's (checked against it, tests/compat): an unknown topic is
UNKNOWN_TOPIC_OR_PARTITION; an unknown key, a bad value ("Invalid config value for resource
..."), APPEND / SUBTRACT on a non-list key and a value asking for a feature tidelog does not
implement (see `tidelog.storage.log_config`) are INVALID_CONFIG naming the key; a null value or
a duplicate key INVALID_REQUEST. Nothing is written unless the whole resource is valid.

Brokers: the dynamic log defaults (`tidelog.broker.dynamic_config`) of one broker (resource name
= its id, answered by that broker) or of the whole cluster (empty name), written to
`/config/brokers/<id>` or `/config/brokers/<default>` with a notification. A key that cannot
change dynamically, or a value that does not hold, is INVALID_REQUEST (as Kafka 3.9); unknown
keys are stored, as Kafka stores custom configs.

The receiving side is the broker's (`BrokerServer`, Kafka's ZkNodeChangeNotificationListener and
TopicConfigHandler): it watches `/config/changes`, and for each new notification
(`ConfigChangeNotifications`) reloads the topic's overrides and hands its logs the new config.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidelog.broker.config import CONFIG_DEFS
from tidelog.broker.dynamic_config import DYNAMIC_DEFAULT
from tidelog.controller.admin import AdminError, validate_topic_name
from tidelog.controller.zk_data import config_change_sequence_number
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import alter_configs as m_ac
from tidelog.protocol.messages import incremental_alter_configs as m_iac
from tidelog.storage.log_config import (
    LogConfig,
    UnknownConfigError,
    UnsupportedConfigError,
)

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.broker.kafka_apis import KafkaApis
    from tidelog.broker.server import BrokerServer
    from tidelog.broker.socket_server import RequestContext

__all__ = ["ConfigApis", "ConfigChangeNotifications", "prepare_topic_config"]

logger = logging.getLogger(__name__)

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
_RESOURCE_NAMES = {2: "TOPIC", 4: "BROKER", 8: "BROKER_LOGGER"}
# Topic configs of Kafka's LIST type (APPEND / SUBTRACT apply to these only).
_LIST_CONFIGS = frozenset({"cleanup.policy", "leader.replication.throttled.replicas",
                           "follower.replication.throttled.replicas"})


@dataclass(frozen=True, slots=True)
class _Op:
    name: str
    op: int
    value: str | None


class _Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ConfigApis:
    def __init__(self, server: BrokerServer) -> None:
        self.server = server

    def register(self, apis: KafkaApis) -> None:
        apis.register_handler(ApiKey.ALTER_CONFIGS, self.handle_alter_configs)
        apis.register_handler(ApiKey.INCREMENTAL_ALTER_CONFIGS, self.handle_incremental_alter_configs)

    async def handle_alter_configs(
        self, ctx: RequestContext, request: m_ac.AlterConfigsRequest
    ) -> m_ac.AlterConfigsResponse:
        out = []
        for r in request.resources:
            ops = [_Op(c.name, OP_SET, c.value) for c in r.configs]
            code, message = await self._alter(r.resource_type, r.resource_name, ops,
                                              request.validate_only, incremental=False)
            out.append(m_ac.AlterConfigsResourceResponse(
                error_code=code, error_message=message, resource_type=r.resource_type,
                resource_name=r.resource_name))
        return m_ac.AlterConfigsResponse(responses=out)

    async def handle_incremental_alter_configs(
        self, ctx: RequestContext, request: m_iac.IncrementalAlterConfigsRequest
    ) -> m_iac.IncrementalAlterConfigsResponse:
        out = []
        for r in request.resources:
            ops = [_Op(c.name, c.config_operation, c.value) for c in r.configs]
            code, message = await self._alter(r.resource_type, r.resource_name, ops,
                                              request.validate_only, incremental=True)
            out.append(m_iac.AlterConfigsResourceResponse(
                error_code=code, error_message=message, resource_type=r.resource_type,
                resource_name=r.resource_name))
        return m_iac.IncrementalAlterConfigsResponse(responses=out)

    async def _alter(self, resource_type: int, name: str, ops: Sequence[_Op],
                     validate_only: bool, *, incremental: bool) -> tuple[int, str | None]:
        resource = (f"ConfigResource(type={_RESOURCE_NAMES.get(resource_type, resource_type)}, "
                    f"name='{name}')")
        try:
            _check_ops(ops, incremental)
            if resource_type == RESOURCE_TOPIC:
                await asyncio.to_thread(self._alter_topic, name, ops, validate_only, incremental)
            elif resource_type == RESOURCE_BROKER:
                await asyncio.to_thread(self._alter_broker, name, ops, validate_only,
                                        incremental)
            else:
                raise _Refused(ErrorCode.INVALID_REQUEST,
                               "AlterConfigs is only supported for topics and brokers, but "
                               f"resource type is {_RESOURCE_NAMES.get(resource_type, resource_type)}")
        except _Refused as e:
            return e.code, e.message
        except AdminError as e:
            return int(e.error_code), e.message
        except (UnknownConfigError, UnsupportedConfigError) as e:
            return ErrorCode.INVALID_CONFIG, str(e)
        except ValueError as e:  # Kafka 3.9 answers a bad value with INVALID_CONFIG too
            return ErrorCode.INVALID_CONFIG, f"Invalid config value for resource {resource}: {e}"
        except Exception as e:
            logger.exception("alter configs of %s failed", resource)
            return ErrorCode.UNKNOWN_SERVER_ERROR, str(e)
        return ErrorCode.NONE, None

    def _alter_topic(self, topic: str, ops: Sequence[_Op], validate_only: bool,
                     incremental: bool) -> None:
        """Runs in a worker thread (ZooKeeper calls)."""
        zk = self.server.zk_client
        validate_topic_name(topic)
        if not zk.topic_exists(topic):
            raise _Refused(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                           f"The topic '{topic}' does not exist.")
        defaults = LogConfig.from_dict(self.server.dynamic_config.current.log_config())
        props = prepare_topic_config(zk.get_topic_config(topic) if incremental else {}, ops,
                                     defaults)
        LogConfig.from_dict(props)
        if not validate_only:
            logger.info("updating topic %s with new configuration: %s", topic, props)
            zk.set_topic_config(topic, props, notify=True)

    def _alter_broker(self, name: str, ops: Sequence[_Op], validate_only: bool,
                      incremental: bool) -> None:
        """This broker's dynamic configs (`name` = its id) or the cluster-wide default (`name`
        empty), in /config/brokers (Kafka's alterBrokerConfigs). Runs in a worker thread."""
        if name and name != str(self.server.broker_id):
            raise _Refused(ErrorCode.INVALID_REQUEST,
                           f"Unexpected broker id, expected {self.server.broker_id}, but "
                           f"received {name}")
        zk = self.server.zk_client
        entity = name or DYNAMIC_DEFAULT
        props = dict(zk.get_broker_config(entity)) if incremental else {}
        for o in ops:
            if o.op == OP_SET:
                props[o.name] = str(o.value)
            elif o.op == OP_DELETE:
                props.pop(o.name, None)
            else:  # APPEND / SUBTRACT: the list-type keys only
                spec = CONFIG_DEFS.get(o.name)
                if spec is None or spec.type != "list":
                    raise _Refused(ErrorCode.INVALID_CONFIG,
                                   f"Config value {_OP_NAMES[o.op].lower()} is not allowed for "
                                   f"config key: {o.name}")
                old = [v for v in props.get(o.name, _list_default(spec.default)).split(",") if v]
                given = [v for v in str(o.value).split(",") if v]
                new = (old + [v for v in given if v not in old] if o.op == OP_APPEND
                       else [v for v in old if v not in given])
                props[o.name] = ",".join(new)
        try:
            self.server.dynamic_config.validate(props, per_broker=bool(name))
        except ValueError as e:
            # Kafka 3.9 answers INVALID_REQUEST with the validation's own message here; a
            # reconfiguration it refuses (thread counts) reads as its ConfigException wrapped in
            # "Invalid dynamic configuration" (checked against 3.9, tests/compat).
            message = str(e) if e.__cause__ is None else (
                f"Invalid value org.apache.kafka.common.config.ConfigException: {e.__cause__} "
                f"for configuration {e}")
            raise _Refused(ErrorCode.INVALID_REQUEST, message) from None
        if not validate_only:
            logger.info("updating %s with new configuration: %s",
                        f"broker {name}" if name else "the cluster-wide broker default", props)
            zk.set_broker_config(entity, props)


def _list_default(default: object) -> str:
    return ",".join(default) if isinstance(default, list) else ""


def _check_ops(ops: Sequence[_Op], incremental: bool) -> None:
    if incremental:
        names = [o.name for o in ops]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise _Refused(ErrorCode.INVALID_REQUEST,
                           f"Error due to duplicate config keys : {','.join(dup)}")
        bad = [o for o in ops if o.op not in (OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT)]
        if bad:
            raise _Refused(ErrorCode.INVALID_REQUEST, f"Unknown config operation {bad[0].op}")
        nulls = [f"{_OP_NAMES[o.op]}:{o.name}" for o in ops if o.value is None and o.op != OP_DELETE]
    else:
        nulls = [o.name for o in ops if o.value is None]
    if nulls:
        raise _Refused(ErrorCode.INVALID_REQUEST, f"Null value not supported for : {','.join(nulls)}")


_OP_NAMES = {OP_SET: "SET", OP_DELETE: "DELETE", OP_APPEND: "APPEND", OP_SUBTRACT: "SUBTRACT"}


def prepare_topic_config(current: Mapping[str, str], ops: Sequence[_Op],
                         defaults: LogConfig) -> dict[str, str]:
    """The overrides after `ops` (Kafka's prepareIncrementalConfigs; for AlterConfigs `current`
    is empty and every op is a SET: the request replaces the overrides)."""
    props = dict(current)
    default_values = defaults.to_dict()
    for o in ops:
        if o.op == OP_SET:
            props[o.name] = str(o.value)
        elif o.op == OP_DELETE:
            props.pop(o.name, None)
        else:
            verb = "append" if o.op == OP_APPEND else "subtract"
            if o.name not in _LIST_CONFIGS:
                raise _Refused(ErrorCode.INVALID_CONFIG,
                               f"Config value {verb} is not allowed for config key: {o.name}")
            old = props.get(o.name)
            if old is None and o.op == OP_APPEND:
                old = str(default_values[o.name])
            items = [v for v in (old or "").split(",") if v]
            given = [v for v in str(o.value).split(",") if v]
            items = (items + [v for v in given if v not in items] if o.op == OP_APPEND
                     else [v for v in items if v not in given])
            props[o.name] = ",".join(items)
    return props


# Kafka's ZkNodeChangeNotificationListener.changeExpirationMs: a notification older than this
# is deleted by the brokers once they have processed the notifications.
CONFIG_CHANGE_EXPIRATION_MS = 15 * 60 * 1000


class ConfigChangeNotifications:
    """Which /config/changes notifications are new (Kafka's lastExecutedChange): those present
    when the broker first looks are taken as applied, since it read every topic's config when
    it started; after that each notification is handed out once, in sequence order. Those older
    than `expiration_ms` are purged after each round (`KafkaZkClient.purge_obsolete_config_changes`)."""

    def __init__(self, expiration_ms: int = CONFIG_CHANGE_EXPIRATION_MS) -> None:
        self.last_executed: int | None = None
        self.expiration_ms = expiration_ms

    def new(self, names: Sequence[str]) -> list[str]:
        seqs = sorted((config_change_sequence_number(n), n) for n in names)
        if self.last_executed is None:
            self.last_executed = max((s for s, _ in seqs), default=-1)
            return []
        out = [n for s, n in seqs if s > self.last_executed]
        if seqs:
            self.last_executed = max(self.last_executed, seqs[-1][0])
        return out
