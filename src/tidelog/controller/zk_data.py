"""Kafka 2.x's ZooKeeper layout: znode paths and their JSON encodings (Kafka's `ZkData.scala`).

Pure functions and value types only (no kazoo), so the simulator and tools can share them:

    /controller                                  {"version":1,"brokerid":1,"timestamp":"..."}
    /controller_epoch                            "7"
    /brokers/ids/<id>  (ephemeral)               {"version":4,"host":..,"port":..,"endpoints":[..],
                                                  "listener_security_protocol_map":{..},
                                                  "jmx_port":-1,"timestamp":"..."}
    /brokers/seqid                               (its version generates broker ids)
    /brokers/topics/<t>                          {"version":3,"partitions":{"0":[1,2,3]},
                                                  "topic_id":"UCx8j9NvSV6UZo-kLaX6Lw",
                                                  "adding_replicas":{},"removing_replicas":{}}
    /brokers/topics/<t>/partitions/<p>/state     {"controller_epoch":1,"leader":1,"version":1,
                                                  "leader_epoch":0,"isr":[1,2,3]}
    /isr_change_notification/isr_change_<seq>    {"version":1,"partitions":[{"topic":t,"partition":p}]}
    /admin/delete_topics/<t>                     (empty)
    /config/topics/<t>                           {"version":1,"config":{"retention.ms":"1000"}}
    /config/changes/config_change_<seq>          {"version":2,"entity_path":"topics/<t>"}
    /cluster/id                                  {"version":"1","id":"..."}
    /latest_producer_id_block                    {"version":1,"broker":1,"block_start":"0",
                                                  "block_end":"999"}
    /tidelog/unclean_replicas                    {"version":1,"partitions":{"<t>:<p>":[2,3]}}

The last one is tidelog's: KIP-966's marks (replicas back from an unclean shutdown, not caught
up since) must survive a controller failover, as ELR state lives in the metadata log in Kafka.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

# (topic, partition); `tidelog.replication.types.TopicPartition` is a NamedTuple of the same
# shape, so either can be passed and results compare equal to it.
TopicPartitionT = tuple[str, int]

CONTROLLER_PATH = "/controller"
CONTROLLER_EPOCH_PATH = "/controller_epoch"
BROKERS_PATH = "/brokers"
BROKER_IDS_PATH = "/brokers/ids"
BROKER_SEQUENCE_ID_PATH = "/brokers/seqid"
TOPICS_PATH = "/brokers/topics"
ISR_CHANGE_NOTIFICATION_PATH = "/isr_change_notification"
ISR_CHANGE_PREFIX = "isr_change_"
LOG_DIR_EVENT_NOTIFICATION_PATH = "/log_dir_event_notification"
LOG_DIR_EVENT_PREFIX = "log_dir_event_"
# LogDirEventNotificationSequenceZNode.LogDirFailureEvent, the only event there is
LOG_DIR_FAILURE_EVENT = 1
ADMIN_PATH = "/admin"
DELETE_TOPICS_PATH = "/admin/delete_topics"
CONFIG_PATH = "/config"
CONFIG_TOPICS_PATH = "/config/topics"
CONFIG_BROKERS_PATH = "/config/brokers"
CONFIG_CHANGES_PATH = "/config/changes"
CONFIG_CHANGE_PREFIX = "config_change_"
CLUSTER_ID_PATH = "/cluster/id"
PRODUCER_ID_BLOCK_PATH = "/latest_producer_id_block"
UNCLEAN_REPLICAS_PATH = "/tidelog/unclean_replicas"

# KafkaController.InitialControllerEpoch / InitialControllerEpochZkVersion
INITIAL_CONTROLLER_EPOCH = 0
INITIAL_CONTROLLER_EPOCH_ZK_VERSION = 0
# ZkVersion.MatchAnyVersion
MATCH_ANY_VERSION = -1
BROKER_INFO_VERSION = 4  # Kafka 0.10.0 .. 2.6 (2.7 added "features" as version 5)
ISR_CHANGE_NOTIFICATION_VERSION = 1

# KafkaZkClient.createTopLevelPaths: the persistent paths every broker makes sure exist.
PERSISTENT_PATHS = (
    "/consumers",
    BROKER_IDS_PATH,
    TOPICS_PATH,
    CONFIG_CHANGES_PATH,
    DELETE_TOPICS_PATH,
    BROKER_SEQUENCE_ID_PATH,
    ISR_CHANGE_NOTIFICATION_PATH,
    PRODUCER_ID_BLOCK_PATH,
    LOG_DIR_EVENT_NOTIFICATION_PATH,
    CONFIG_TOPICS_PATH,
    "/config/clients",
    "/config/users",
    "/config/brokers",
)


class ZkDataError(ValueError):
    """A znode holds data that is not what Kafka's layout says it should be."""


def _encode(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def _decode(path: str, data: bytes | None) -> Any:
    if not data:
        raise ZkDataError(f"{path}: empty znode")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ZkDataError(f"{path}: invalid JSON ({e})") from None


def _now_ms_str() -> str:
    return str(int(time.time() * 1000))


# --- paths ------------------------------------------------------------------------------------


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS_PATH}/{broker_id}"


def topic_path(topic: str) -> str:
    return f"{TOPICS_PATH}/{topic}"


def topic_partitions_path(topic: str) -> str:
    return f"{TOPICS_PATH}/{topic}/partitions"


def topic_partition_path(tp: TopicPartitionT) -> str:
    return f"{TOPICS_PATH}/{tp[0]}/partitions/{tp[1]}"


def partition_state_path(tp: TopicPartitionT) -> str:
    return f"{topic_partition_path(tp)}/state"


def delete_topic_path(topic: str) -> str:
    return f"{DELETE_TOPICS_PATH}/{topic}"


def topic_config_path(topic: str) -> str:
    return f"{CONFIG_TOPICS_PATH}/{topic}"


def broker_config_path(entity: str) -> str:
    """/config/brokers/<id>, or /config/brokers/<default> for the cluster-wide default."""
    return f"{CONFIG_BROKERS_PATH}/{entity}"


def isr_change_path(sequence_number: str) -> str:
    return f"{ISR_CHANGE_NOTIFICATION_PATH}/{ISR_CHANGE_PREFIX}{sequence_number}"


def isr_change_sequence_number(name_or_path: str) -> str:
    i = name_or_path.rfind(ISR_CHANGE_PREFIX)
    return name_or_path[i + len(ISR_CHANGE_PREFIX) :] if i >= 0 else name_or_path


# --- /controller, /controller_epoch -------------------------------------------------------------


def encode_controller(broker_id: int, timestamp_ms: int | None = None) -> bytes:
    ts = str(timestamp_ms) if timestamp_ms is not None else _now_ms_str()
    return _encode({"version": 1, "brokerid": broker_id, "timestamp": ts})


def decode_controller(data: bytes | None) -> int:
    obj = _decode(CONTROLLER_PATH, data)
    try:
        return int(obj["brokerid"])
    except (KeyError, TypeError, ValueError):
        raise ZkDataError(f"{CONTROLLER_PATH}: no brokerid in {obj!r}") from None


def encode_controller_epoch(epoch: int) -> bytes:
    return str(epoch).encode("ascii")


def decode_controller_epoch(data: bytes | None) -> int:
    try:
        return int((data or b"").decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ZkDataError(f"{CONTROLLER_EPOCH_PATH}: not an integer: {data!r}") from None


# --- /brokers/ids/<id> ----------------------------------------------------------------------


@dataclass(frozen=True)
class BrokerEndPoint:
    listener_name: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"

    @property
    def connection_string(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.listener_name}://{host}:{self.port}"


@dataclass(frozen=True)
class BrokerInfo:
    """A broker's registration: its advertised endpoints (Kafka's `BrokerInfo`/`Broker`)."""

    broker_id: int
    endpoints: tuple[BrokerEndPoint, ...]
    rack: str | None = None
    jmx_port: int = -1
    version: int = BROKER_INFO_VERSION
    # tidelog's addition (KIP-966): False when the broker started after an unclean shutdown
    # (its log dirs had no clean-shutdown marker), None when it does not say. Encoded as
    # "tidelog_clean_shutdown"; Kafka's readers ignore fields they do not know.
    clean_shutdown: bool | None = None

    @classmethod
    def from_endpoints(
        cls, broker_id: int, endpoints: Iterable[Any], rack: str | None = None,
        clean_shutdown: bool | None = None,
    ) -> BrokerInfo:
        """From any objects with listener_name/host/port/security_protocol (KafkaConfig's)."""
        eps = tuple(
            BrokerEndPoint(e.listener_name, e.host, int(e.port), e.security_protocol)
            for e in endpoints
        )
        return cls(broker_id, eps, rack, clean_shutdown=clean_shutdown)

    def endpoint(self, listener_name: str = "PLAINTEXT") -> BrokerEndPoint | None:
        return next((e for e in self.endpoints if e.listener_name == listener_name), None)

    def encode(self, timestamp_ms: int | None = None) -> bytes:
        # The top-level host/port are for old clients: the first PLAINTEXT endpoint, if any.
        plain = next((e for e in self.endpoints if e.security_protocol == "PLAINTEXT"), None)
        obj: dict[str, Any] = {
            "version": self.version,
            "host": plain.host if plain else None,
            "port": plain.port if plain else -1,
            "endpoints": [e.connection_string for e in self.endpoints],
            "jmx_port": self.jmx_port,
            "timestamp": str(timestamp_ms) if timestamp_ms is not None else _now_ms_str(),
        }
        if self.rack is not None:
            obj["rack"] = self.rack
        obj["listener_security_protocol_map"] = {
            e.listener_name: e.security_protocol for e in self.endpoints
        }
        if self.clean_shutdown is not None:
            obj["tidelog_clean_shutdown"] = self.clean_shutdown
        return _encode(obj)

    @classmethod
    def decode(cls, broker_id: int, data: bytes | None) -> BrokerInfo:
        path = broker_path(broker_id)
        obj = _decode(path, data)
        try:
            version = int(obj["version"])
            jmx_port = int(obj.get("jmx_port", -1))
            if version == 1:
                eps: tuple[BrokerEndPoint, ...] = (
                    BrokerEndPoint("PLAINTEXT", obj["host"], int(obj["port"])),
                )
            else:
                proto_map = obj.get("listener_security_protocol_map") or {}
                parsed = []
                for conn in obj["endpoints"]:
                    name, _, hostport = conn.partition("://")
                    host, _, port = hostport.rpartition(":")
                    parsed.append(
                        BrokerEndPoint(
                            name, host.strip("[]"), int(port), proto_map.get(name, name)
                        )
                    )
                eps = tuple(parsed)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ZkDataError(f"{path}: invalid broker registration ({e!r})") from None
        clean = obj.get("tidelog_clean_shutdown")
        return cls(broker_id, eps, obj.get("rack"), jmx_port, version,
                   clean if isinstance(clean, bool) else None)


# --- /brokers/topics/<t> ----------------------------------------------------------------------


def topic_id_to_string(topic_id: UUID) -> str:
    """Kafka's `Uuid.toString`: the 16 bytes in URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(topic_id.bytes).decode("ascii").rstrip("=")


def topic_id_from_string(text: str) -> UUID:
    """Kafka's `Uuid.fromString`."""
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if len(raw) != 16:
        raise ValueError(f"a topic id is 16 bytes, {text!r} has {len(raw)}")
    return UUID(bytes=raw)


def encode_topic_assignment(assignment: Mapping[int, Sequence[int]],
                            topic_id: UUID | None = None,
                            adding: Mapping[int, Sequence[int]] | None = None,
                            removing: Mapping[int, Sequence[int]] | None = None) -> bytes:
    """Kafka's TopicZNode: version 3 with "topic_id" when the topic has one (Kafka 2.8+),
    version 2 without; "adding_replicas"/"removing_replicas" list the partitions being
    reassigned (KIP-455), each with the replicas joining/leaving its full replica set."""
    partitions = {str(p): list(replicas) for p, replicas in sorted(assignment.items())}
    obj: dict[str, Any] = {
        "version": 2 if topic_id is None else 3, "partitions": partitions,
        "adding_replicas": {str(p): list(rs) for p, rs in sorted((adding or {}).items()) if rs},
        "removing_replicas": {str(p): list(rs)
                              for p, rs in sorted((removing or {}).items()) if rs}}
    if topic_id is not None:
        obj["topic_id"] = topic_id_to_string(topic_id)
    return _encode(obj)


def decode_topic_assignment(topic: str, data: bytes | None) -> dict[int, list[int]]:
    return decode_topic_znode(topic, data)[0]


def decode_topic_znode(topic: str, data: bytes | None) -> tuple[dict[int, list[int]], UUID | None]:
    """(assignment, topic id); the id is None for a topic written before topic ids (version 1-2)."""
    obj = _decode(topic_path(topic), data)
    try:
        assignment = {int(p): [int(r) for r in replicas]
                      for p, replicas in obj["partitions"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ZkDataError(f"{topic_path(topic)}: invalid assignment ({e!r})") from None
    text = obj.get("topic_id")
    if text is None:
        return assignment, None
    try:
        return assignment, topic_id_from_string(str(text))
    except ValueError as e:
        raise ZkDataError(f"{topic_path(topic)}: invalid topic_id ({e})") from None


def decode_topic_reassignments(topic: str, data: bytes | None
                               ) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """A topic znode's (adding_replicas, removing_replicas) per partition (empty when absent,
    as in a version 1 znode)."""
    obj = _decode(topic_path(topic), data)
    try:
        adding, removing = ({int(p): [int(r) for r in rs] for p, rs in (obj.get(key) or {}).items()}
                            for key in ("adding_replicas", "removing_replicas"))
        return adding, removing
    except (TypeError, ValueError, AttributeError) as e:
        raise ZkDataError(f"{topic_path(topic)}: invalid adding/removing replicas ({e!r})"
                          ) from None


# --- /brokers/topics/<t>/partitions/<p>/state ---------------------------------------------------


@dataclass(frozen=True)
class LeaderIsrAndControllerEpoch:
    """A partition's state znode: Kafka's `LeaderIsrAndControllerEpoch` (+ the znode version).

    `zk_version` is the version of the state znode (Kafka's `partitionEpoch`/`zkVersion`), the
    compare-and-set token of every later update; -1 when not read from ZooKeeper.
    """

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    zk_version: int = -1

    def encode(self) -> bytes:
        return _encode(
            {
                "controller_epoch": self.controller_epoch,
                "leader": self.leader,
                "version": 1,
                "leader_epoch": self.leader_epoch,
                "isr": list(self.isr),
            }
        )

    @classmethod
    def decode(cls, tp: TopicPartitionT, data: bytes | None, zk_version: int) -> LeaderIsrAndControllerEpoch:
        path = partition_state_path(tp)
        obj = _decode(path, data)
        try:
            return cls(
                leader=int(obj["leader"]),
                leader_epoch=int(obj["leader_epoch"]),
                isr=tuple(int(b) for b in obj["isr"]),
                controller_epoch=int(obj["controller_epoch"]),
                zk_version=zk_version,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ZkDataError(f"{path}: invalid partition state ({e!r})") from None

    def same_state(self, other: LeaderIsrAndControllerEpoch) -> bool:
        """Equal apart from the zk version (Kafka's `checkLeaderAndIsrZkData`)."""
        return (
            self.leader == other.leader
            and self.leader_epoch == other.leader_epoch
            and tuple(self.isr) == tuple(other.isr)
            and self.controller_epoch == other.controller_epoch
        )


# --- /tidelog/unclean_replicas (KIP-966 marks) --------------------------------------------------


def encode_unclean_replicas(marks: Mapping[TopicPartitionT, Iterable[int]]) -> bytes:
    """Only partitions with at least one mark; keys "<topic>:<partition>" (a topic name has no
    colon in Kafka's legal characters, so the last colon splits)."""
    parts = {f"{t}:{p}": sorted(int(b) for b in ids)
             for (t, p), ids in sorted(marks.items()) if ids}
    return json.dumps({"version": 1, "partitions": parts}, sort_keys=True).encode("utf-8")


def decode_unclean_replicas(data: bytes | None) -> dict[TopicPartitionT, set[int]]:
    obj = _decode(UNCLEAN_REPLICAS_PATH, data)
    try:
        out: dict[TopicPartitionT, set[int]] = {}
        for key, ids in obj["partitions"].items():
            topic, _, p = key.rpartition(":")
            out[(topic, int(p))] = {int(i) for i in ids}
        return out
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ZkDataError(f"{UNCLEAN_REPLICAS_PATH}: invalid KIP-966 marks ({e!r})") from None


# --- notifications and configs ----------------------------------------------------------------


def encode_isr_change_notification(partitions: Iterable[TopicPartitionT]) -> bytes:
    items = sorted({(str(t), int(p)) for t, p in partitions})
    return _encode(
        {
            "version": ISR_CHANGE_NOTIFICATION_VERSION,
            "partitions": [{"topic": t, "partition": p} for t, p in items],
        }
    )


def decode_isr_change_notification(path: str, data: bytes | None) -> set[TopicPartitionT]:
    obj = _decode(path, data)
    try:
        return {(str(e["topic"]), int(e["partition"])) for e in obj["partitions"]}
    except (KeyError, TypeError, ValueError) as e:
        raise ZkDataError(f"{path}: invalid ISR change notification ({e!r})") from None


def log_dir_event_path(sequence_number: str) -> str:
    return f"{LOG_DIR_EVENT_NOTIFICATION_PATH}/{LOG_DIR_EVENT_PREFIX}{sequence_number}"


def log_dir_event_sequence_number(name_or_path: str) -> str:
    i = name_or_path.rfind(LOG_DIR_EVENT_PREFIX)
    return name_or_path[i + len(LOG_DIR_EVENT_PREFIX) :] if i >= 0 else name_or_path


def encode_log_dir_event_notification(broker_id: int) -> bytes:
    """Kafka's LogDirEventNotificationSequenceZNode.encode."""
    return _encode({"version": 1, "broker": int(broker_id), "event": LOG_DIR_FAILURE_EVENT})


def decode_log_dir_event_notification(path: str, data: bytes | None) -> int:
    """The broker whose log dir failed."""
    obj = _decode(path, data)
    try:
        return int(obj["broker"])
    except (KeyError, TypeError, ValueError) as e:
        raise ZkDataError(f"{path}: invalid log dir event notification ({e!r})") from None


def encode_config(config: Mapping[str, Any]) -> bytes:
    return _encode({"version": 1, "config": {str(k): _config_str(v) for k, v in config.items()}})


def _config_str(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list | tuple):
        return ",".join(str(x) for x in v)
    return str(v)


def decode_config(path: str, data: bytes | None) -> dict[str, str]:
    if not data:
        return {}
    obj = _decode(path, data)
    config = obj.get("config") if isinstance(obj, dict) else None
    if not isinstance(config, dict):
        return {}
    return {str(k): str(v) for k, v in config.items()}


def encode_config_change(entity_path: str) -> bytes:
    return _encode({"version": 2, "entity_path": entity_path})


def decode_config_change(path: str, data: bytes | None) -> str:
    """The entity path of a /config/changes notification ("topics/<t>", "brokers/<id>")."""
    obj = _decode(path, data)
    entity = obj.get("entity_path") if isinstance(obj, dict) else None
    if not isinstance(entity, str):
        raise ZkDataError(f"{path}: no entity_path in {obj!r}")
    return entity


def config_change_sequence_number(name: str) -> int:
    return int(name[len(CONFIG_CHANGE_PREFIX):])


def encode_cluster_id(cluster_id: str) -> bytes:
    return _encode({"version": "1", "id": cluster_id})


def decode_cluster_id(data: bytes | None) -> str:
    obj = _decode(CLUSTER_ID_PATH, data)
    try:
        return str(obj["id"])
    except (KeyError, TypeError):
        raise ZkDataError(f"{CLUSTER_ID_PATH}: no id in {obj!r}") from None

