"""`KafkaConfig`: a broker's `server.properties`, with Kafka's keys, types and defaults.

The file is read with Java `Properties` syntax (``key=value``, ``key: value``, ``key value``,
``#``/``!`` comments, backslash line continuations, ``\\t``/``\\n``/``\\uXXXX`` escapes), then
``--override key=value`` pairs are applied on top, then every value is parsed to its Kafka type
and validated. Any problem is a `ConfigError` whose one-line message starts with the key.

Defaults are Kafka's (checked against apache/kafka `KafkaConfig`/`Defaults`, 3.x). Notes:

- ``replica.lag.time.max.ms`` defaults to 30000, Kafka's default since 2.5 (KIP-537); before
  2.5 it was 10000, the value the seeds describe. Set it explicitly to reproduce the seeds.
- ``replica.lag.max.messages`` is a tidelog extension: Kafka removed it in 0.9. When unset (the
  default) only the time rule applies, as in Kafka >= 0.9. Setting it to N >= 1 also applies the
  pre-0.9 rule (a follower more than N messages behind the leader's LEO leaves the ISR; 0.8's
  default was 4000), for the flapping experiments of seed 003.
- ``tidelog.replication.events.enable`` (default false) is a tidelog extension: the broker
  appends its ISR changes, elections and HW checkpoints to the internal topic
  ``__replication_events`` (`tidelog.broker.replication_events`).
- Unknown keys are an error (Kafka only warns) so that a typo never silently falls back to a
  default. Keys of Kafka's stock `server.properties` that tidelog accepts but does not act on
  are defined here too and marked "accepted, unused" in their doc.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidelog.broker.replica_selector import replica_selector_class_error

__all__ = [
    "CONFIG_DEFS",
    "ConfigError",
    "ConfigKey",
    "EndPoint",
    "KafkaConfig",
    "load_properties",
    "parse_overrides",
    "parse_properties",
]

INT_MAX = 2**31 - 1
INT_MIN = -(2**31)
LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)
SHORT_MAX = 2**15 - 1
SHORT_MIN = -(2**15)

# Records.LOG_OVERHEAD (offset + size) is added to 1 MiB for message.max.bytes.
LOG_OVERHEAD = 12
# LegacyRecord.RECORD_OVERHEAD_V0: the smallest segment Kafka accepts.
RECORD_OVERHEAD_V0 = 14


class ConfigError(ValueError):
    """A bad `server.properties` or override: the message is one line and names the key."""

    def __init__(self, key: str | None, message: str) -> None:
        self.key = key
        text = f"{key}: {message}" if key else message
        super().__init__(" ".join(text.split("\n")))


def _java_absolute_file(path: str) -> str:
    """java.io.File(path).getAbsoluteFile(): repeated and trailing separators dropped, a
    relative path put under the working dir, nothing else resolved."""
    path = re.sub("/+", "/", path)
    if len(path) > 1:
        path = path.rstrip("/")
    return path if path.startswith("/") else os.path.join(os.getcwd(), path)


def _refuse_duplicate_log_dirs(log_dirs: list[str]) -> None:
    """Kafka's LogManager.createAndValidateLogDirs: two log dirs with the same canonical path
    (`a` and `a/`, a relative and an absolute path, a symlink and its target) stop the broker,
    the message listing every dir as an absolute path."""
    dirs = [_java_absolute_file(d) for d in log_dirs]
    if len({os.path.realpath(d) for d in dirs}) < len(dirs):
        raise ConfigError(None, f"Duplicate log directory found: {', '.join(dirs)}")


# ---------------------------------------------------------------------------------------------
# Java Properties syntax
# ---------------------------------------------------------------------------------------------

_WHITESPACE = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str, line_no: int) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        i += 1
        if i >= len(text):  # a lone trailing backslash (end of file): Java drops it
            break
        ch = text[i]
        if ch == "u":
            hex_digits = text[i + 1 : i + 5]
            if len(hex_digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in hex_digits):
                raise ConfigError(None, f"line {line_no}: malformed \\uxxxx escape")
            out.append(chr(int(hex_digits, 16)))
            i += 5
            continue
        out.append(_ESCAPES.get(ch, ch))
        i += 1
    return "".join(out)


def _logical_lines(text: str) -> Iterable[tuple[int, str]]:
    """Yield (first natural line number, logical line) with continuations joined."""
    natural = re.split(r"\r\n|\r|\n", text)
    i = 0
    while i < len(natural):
        start = i
        line = natural[i].lstrip(_WHITESPACE)
        i += 1
        if not line or line[0] in "#!":
            continue  # comment lines never continue, even when they end with a backslash
        parts: list[str] = []
        while True:
            trailing = len(line) - len(line.rstrip("\\"))
            if trailing % 2 == 1:
                parts.append(line[:-1])
                if i >= len(natural):
                    break
                line = natural[i].lstrip(_WHITESPACE)
                i += 1
                continue
            parts.append(line)
            break
        yield start + 1, "".join(parts)


def _split_key_value(line: str) -> tuple[str, str]:
    i = 0
    n = len(line)
    while i < n:
        ch = line[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "=:" or ch in _WHITESPACE:
            break
        i += 1
    key = line[:i]
    rest = line[i:].lstrip(_WHITESPACE)
    if rest and rest[0] in "=:":
        rest = rest[1:].lstrip(_WHITESPACE)
    return key, rest


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java `Properties` text into a dict (later keys win, as `Properties.load`)."""
    props: dict[str, str] = {}
    for line_no, line in _logical_lines(text):
        raw_key, raw_value = _split_key_value(line)
        key = _unescape(raw_key, line_no)
        value = _unescape(raw_value, line_no)
        props[key] = value
    return props


def load_properties(path: str | Path) -> dict[str, str]:
    """Read a properties file. UTF-8 is tried first, then ISO-8859-1 (Java's own encoding)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(None, f"cannot read properties file {p}: {e.strerror or e}") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("iso-8859-1")
    return parse_properties(text)


def parse_overrides(overrides: Iterable[str]) -> dict[str, str]:
    """`--override key=value` strings -> dict; the value may contain '=' and may be empty."""
    out: dict[str, str] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(None, f"override {item!r} is not of the form key=value")
        out[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# Key definitions
# ---------------------------------------------------------------------------------------------

Validator = Callable[[Any], str | None]  # returns an error message, or None when valid


def at_least(minimum: int | float) -> Validator:
    def check(value: Any) -> str | None:
        if value is not None and value < minimum:
            return f"value {value} must be at least {minimum}"
        return None

    return check


def between(lo: int, hi: int) -> Validator:
    def check(value: Any) -> str | None:
        if value is not None and not lo <= value <= hi:
            return f"value {value} must be between {lo} and {hi}"
        return None

    return check


def one_of(*choices: str) -> Validator:
    def check(value: Any) -> str | None:
        values = value if isinstance(value, list) else [value]
        for v in values:
            if v is not None and v not in choices:
                return f"value {v!r} must be one of {', '.join(choices)}"
        return None

    return check


@dataclass(frozen=True)
class ConfigKey:
    """One broker key: Kafka's name, its type, Kafka's default (None = no default)."""

    name: str
    type: str  # "int" | "long" | "short" | "double" | "boolean" | "string" | "list" | "password"
    default: Any
    validator: Validator | None = None
    doc: str = ""


CONFIG_DEFS: dict[str, ConfigKey] = {}


def define(
    name: str, type_: str, default: Any, validator: Validator | None = None, doc: str = ""
) -> None:
    """Register a key (other modules may add theirs at import time)."""
    if type_ not in _PARSERS:
        raise ValueError(f"unknown config type {type_!r} for {name}")
    CONFIG_DEFS[name] = ConfigKey(name, type_, default, validator, doc)


def _parse_int(bits_lo: int, bits_hi: int, kind: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        t = text.strip()
        if not re.fullmatch(r"[+-]?[0-9]+", t):
            raise ValueError(f"value {text!r} is not a valid {kind}")
        v = int(t)
        if not bits_lo <= v <= bits_hi:
            raise ValueError(f"value {text!r} is out of range for a {kind}")
        return v

    return parse


def _parse_double(text: str) -> float:
    t = text.strip()
    try:
        return float(t)
    except ValueError:
        raise ValueError(f"value {text!r} is not a valid double") from None


def _parse_boolean(text: str) -> bool:
    t = text.strip().lower()
    if t == "true":
        return True
    if t == "false":
        return False
    raise ValueError(f"value {text!r} is not a valid boolean (expected true or false)")


def _parse_list(text: str) -> list[str]:
    t = text.strip()
    if not t:
        return []
    return [item.strip() for item in t.split(",")]


_PARSERS: dict[str, Callable[[str], Any]] = {
    "int": _parse_int(INT_MIN, INT_MAX, "int"),
    "long": _parse_int(LONG_MIN, LONG_MAX, "long"),
    "short": _parse_int(SHORT_MIN, SHORT_MAX, "short"),
    "double": _parse_double,
    "boolean": _parse_boolean,
    "string": lambda text: text.strip(),
    "password": lambda text: text,
    "list": _parse_list,
}

_UNUSED = "accepted, unused by tidelog"

# --- ZooKeeper
define("zookeeper.connect", "string", None, doc="ZooKeeper connect string host:port[,host:port][/chroot]")
define("zookeeper.session.timeout.ms", "int", 18000, at_least(1))
define("zookeeper.connection.timeout.ms", "int", None, at_least(1),
       doc="defaults to zookeeper.session.timeout.ms")
define("zookeeper.max.in.flight.requests", "int", 10, at_least(1), doc=_UNUSED)
define("zookeeper.set.acl", "boolean", False, doc=_UNUSED)
# --- General
define("broker.id", "int", -1, at_least(-1), doc="-1 = generate one from /brokers/seqid")
define("broker.id.generation.enable", "boolean", True)
define("reserved.broker.max.id", "int", 1000, at_least(0))
define("broker.rack", "string", None)
define("message.max.bytes", "int", 1024 * 1024 + LOG_OVERHEAD, at_least(0))
define("num.network.threads", "int", 3, at_least(1), doc=_UNUSED)
define("num.io.threads", "int", 8, at_least(1), doc=_UNUSED)
define("background.threads", "int", 10, at_least(1), doc=_UNUSED)
define("queued.max.requests", "int", 500, at_least(1),
       doc=_UNUSED + ": requests are handled on the event loop as they are read; there is no "
           "shared request queue to bound")
define("request.timeout.ms", "int", 30000, at_least(0),
       doc="the transaction coordinator's: its __transaction_state writes and WriteTxnMarkers "
           "requests, and a partition leader's marker writes (the controller's requests use "
           "controller.socket.timeout.ms)")
# --- Socket server
define("listeners", "string", "PLAINTEXT://:9092")
define("advertised.listeners", "string", None, doc="defaults to listeners")
define("listener.security.protocol.map", "string",
       "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL")
define("inter.broker.listener.name", "string", None)
define("security.inter.broker.protocol", "string", "PLAINTEXT",
       one_of("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"))
define("socket.send.buffer.bytes", "int", 100 * 1024)
define("socket.receive.buffer.bytes", "int", 100 * 1024)
define("socket.request.max.bytes", "int", 100 * 1024 * 1024, at_least(1))
define("max.connections", "int", INT_MAX, at_least(0))
define("max.connections.per.ip", "int", INT_MAX, at_least(0))
define("connections.max.idle.ms", "long", 10 * 60 * 1000)
# --- Log
define("num.partitions", "int", 1, at_least(1))
define("log.dir", "string", "/tmp/kafka-logs")
define("log.dirs", "string", None, doc="comma-separated; overrides log.dir")
define("log.segment.bytes", "int", 1024 * 1024 * 1024, at_least(RECORD_OVERHEAD_V0))
define("log.roll.ms", "long", None)
define("log.roll.hours", "int", 24 * 7, at_least(1))
define("log.roll.jitter.ms", "long", None)
define("log.roll.jitter.hours", "int", 0, at_least(0))
define("log.retention.ms", "long", None)
define("log.retention.minutes", "int", None)
define("log.retention.hours", "int", 24 * 7)
define("log.retention.bytes", "long", -1)
define("log.retention.check.interval.ms", "long", 5 * 60 * 1000, at_least(1))
define("log.initial.task.delay.ms", "long", 30 * 1000, at_least(0),
       doc="when the log manager's tasks (retention, flusher, recovery-point checkpoint) first "
           "run after start; Kafka's internal key, for tests")
define("log.cleanup.policy", "list", ["delete"], one_of("compact", "delete"))
define("log.cleaner.enable", "boolean", True,
       doc="run the log cleaner, which compacts the logs of cleanup.policy=compact topics")
define("log.cleaner.threads", "int", 1, at_least(0),
       doc="cleaning passes run at once (steps on the event loop, not threads)")
define("log.cleaner.dedupe.buffer.size", "long", 128 * 1024 * 1024,
       doc="bytes of key->offset map across all cleaners (24 bytes a key, as Kafka's)")
define("log.cleaner.io.buffer.load.factor", "double", 0.9)
define("log.cleaner.io.max.bytes.per.second", "double", sys.float_info.max)
define("log.cleaner.backoff.ms", "long", 15 * 1000, at_least(0))
define("log.cleaner.delete.retention.ms", "long", 24 * 60 * 60 * 1000, at_least(0))
define("log.cleaner.min.compaction.lag.ms", "long", 0, at_least(0))
define("log.cleaner.max.compaction.lag.ms", "long", LONG_MAX, at_least(1))
define("log.cleaner.min.cleanable.ratio", "double", 0.5, between(0, 1))
define("log.index.size.max.bytes", "int", 10 * 1024 * 1024, at_least(4))
define("log.index.interval.bytes", "int", 4096, at_least(0))
define("log.flush.interval.messages", "long", LONG_MAX, at_least(1))
define("log.flush.interval.ms", "long", None, doc="defaults to log.flush.scheduler.interval.ms")
define("log.flush.scheduler.interval.ms", "long", LONG_MAX)
define("log.flush.offset.checkpoint.interval.ms", "int", 60000, at_least(0))
define("log.flush.start.offset.checkpoint.interval.ms", "int", 60000, at_least(0),
       doc=_UNUSED + ": the log start offsets are checkpointed with the recovery points "
           "(log.flush.offset.checkpoint.interval.ms)")
define("log.segment.delete.delay.ms", "long", 60000, at_least(0))
define("log.preallocate", "boolean", False,
       doc="false only: tidelog does not preallocate segment files")
define("log.message.timestamp.type", "string", "CreateTime", one_of("CreateTime", "LogAppendTime"))
define("log.message.timestamp.difference.max.ms", "long", LONG_MAX)
define("log.message.timestamp.before.max.ms", "long", LONG_MAX, at_least(0))
define("log.message.timestamp.after.max.ms", "long", LONG_MAX, at_least(0))
define("log.message.downconversion.enable", "boolean", True,
       doc="Kafka consults it for a client's Fetch v0-3 only (down-convert, or refuse with "
           "UNSUPPORTED_VERSION); tidelog serves Fetch v4+, so either value answers every "
           "fetch as Kafka does")
define("num.recovery.threads.per.data.dir", "int", 1, at_least(1), doc=_UNUSED)
define("auto.create.topics.enable", "boolean", True)
define("min.insync.replicas", "int", 1, at_least(1))
define("compression.type", "string", "producer",
       one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"))
define("compression.gzip.level", "int", -1,
       lambda v: None if v in (None, -1) or 1 <= v <= 9 else f"value {v} must be -1 or in [1, 9]")
define("compression.lz4.level", "int", 9, between(9, 9),
       doc="9 only: lz4 batches are written with LZ4's fast compressor (Kafka's level 9)")
define("compression.zstd.level", "int", 3, between(-131072, 22))
define("delete.topic.enable", "boolean", True)
# --- Replication
define("controller.socket.timeout.ms", "int", 30000)
define("default.replication.factor", "int", 1)
define("replica.lag.time.max.ms", "long", 30000)
define("replica.lag.max.messages", "long", None, at_least(1),
       doc="tidelog extension: pre-0.9 message-count ISR rule; unset = off")
define("replica.socket.timeout.ms", "int", 30 * 1000)
define("replica.socket.receive.buffer.bytes", "int", 64 * 1024,
       doc=_UNUSED + ": the fetchers' sockets keep the OS default")
define("replica.fetch.max.bytes", "int", 1024 * 1024, at_least(0))
define("replica.fetch.wait.max.ms", "int", 500)
define("replica.fetch.backoff.ms", "int", 1000, at_least(0))
define("replica.fetch.min.bytes", "int", 1)
define("replica.fetch.response.max.bytes", "int", 10 * 1024 * 1024, at_least(0))
define("replica.selector.class", "string", None, replica_selector_class_error,
       doc="KIP-392: org.apache.kafka.common.replica.RackAwareReplicaSelector or unset (leader only)")
define("num.replica.fetchers", "int", 1)
define("replica.high.watermark.checkpoint.interval.ms", "long", 5000)
define("fetch.purgatory.purge.interval.requests", "int", 1000,
       doc=_UNUSED + ": a completed delayed fetch's other watches are dropped "
           "the next time their partition is checked; there is no purge pass")
define("producer.purgatory.purge.interval.requests", "int", 1000,
       doc=_UNUSED + ": a completed delayed produce's other watches are dropped "
           "the next time their partition is checked; there is no purge pass")
define("auto.leader.rebalance.enable", "boolean", True)
define("leader.imbalance.per.broker.percentage", "int", 10)
define("leader.imbalance.check.interval.seconds", "long", 300)
define("unclean.leader.election.enable", "boolean", False)
define("fetch.max.bytes", "int", 55 * 1024 * 1024, at_least(1024))
define("max.incremental.fetch.session.cache.slots", "int", 1000, at_least(0))
define("replication.quota.window.num", "int", 11, at_least(1),
       doc="samples of the replication throttles' rate (leader and follower)")
define("replication.quota.window.size.seconds", "int", 1, at_least(1),
       doc="the time span of each sample of the replication throttles' rate")
define("alter.log.dirs.replication.quota.window.num", "int", 11, at_least(1),
       doc="samples of the rate of copies between log dirs")
define("alter.log.dirs.replication.quota.window.size.seconds", "int", 1, at_least(1),
       doc="the time span of each sample of the rate of copies between log dirs")
# --- Controlled shutdown
define("controlled.shutdown.enable", "boolean", True)
define("controlled.shutdown.max.retries", "int", 3)
define("controlled.shutdown.retry.backoff.ms", "long", 5000)
# --- Group coordinator / offsets / transactions (Kafka's stock server.properties sets these)
define("group.initial.rebalance.delay.ms", "int", 3000)
define("group.min.session.timeout.ms", "int", 6000)
define("group.max.session.timeout.ms", "int", 1800000)
define("offsets.topic.replication.factor", "short", 3, at_least(1))
define("offsets.topic.num.partitions", "int", 50, at_least(1))
define("offsets.topic.segment.bytes", "int", 100 * 1024 * 1024, at_least(1))
define("offsets.retention.minutes", "int", 7 * 24 * 60, at_least(1))
define("transaction.state.log.replication.factor", "short", 3, at_least(1))
define("transaction.state.log.min.isr", "int", 2, at_least(1))
define("transaction.state.log.num.partitions", "int", 50, at_least(1))
define("transaction.state.log.segment.bytes", "int", 100 * 1024 * 1024, at_least(1))
define("transaction.max.timeout.ms", "int", 900000, at_least(1))
define("transaction.partition.verification.enable", "boolean", True,
       doc="KIP-890: a partition leader asks the transaction coordinator whether a "
           "transactional produce's partition is in its transaction before appending it "
           "(dynamic).")
define("transaction.abort.timed.out.transaction.cleanup.interval.ms", "int", 10000, at_least(1))
define("transactional.id.expiration.ms", "int", 604800000, at_least(1))
define("transaction.remove.expired.transaction.cleanup.interval.ms", "int", 3600000, at_least(1))
define("producer.id.expiration.ms", "int", 86400000, at_least(1))
# --- tidelog extensions
define("tidelog.replication.events.enable", "boolean", False,
       doc="tidelog extension: publish ISR changes, elections and HW checkpoints to "
           "__replication_events")

# Broker key -> topic-level LogConfig key, for the keys that map one to one
# (kafka.server.KafkaServer.copyKafkaConfigToLog / LogConfig.extractLogConfigMap).
_LOG_CONFIG_SYNONYMS: dict[str, str] = {
    "segment.bytes": "log.segment.bytes",
    "segment.index.bytes": "log.index.size.max.bytes",
    "flush.messages": "log.flush.interval.messages",
    "retention.bytes": "log.retention.bytes",
    "max.message.bytes": "message.max.bytes",
    "index.interval.bytes": "log.index.interval.bytes",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "cleanup.policy": "log.cleanup.policy",
    "min.insync.replicas": "min.insync.replicas",
    "compression.type": "compression.type",
    "compression.gzip.level": "compression.gzip.level",
    "compression.lz4.level": "compression.lz4.level",
    "compression.zstd.level": "compression.zstd.level",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
    "preallocate": "log.preallocate",
    "message.timestamp.type": "log.message.timestamp.type",
    "message.timestamp.difference.max.ms": "log.message.timestamp.difference.max.ms",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "message.downconversion.enable": "log.message.downconversion.enable",
}


# ---------------------------------------------------------------------------------------------
# Listeners
# ---------------------------------------------------------------------------------------------

_LISTENER_RE = re.compile(r"^(.*)://\[?([0-9a-zA-Z\-%._:]*)\]?:(-?[0-9]+)$")


@dataclass(frozen=True)
class EndPoint:
    """A listener: `PLAINTEXT://host:port`. An empty host means every interface."""

    listener_name: str
    host: str
    port: int
    security_protocol: str

    @property
    def connection_string(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.listener_name}://{host}:{self.port}"


def _parse_protocol_map(key: str, text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in _parse_list(text):
        name, sep, proto = item.partition(":")
        if not sep or not name.strip() or not proto.strip():
            raise ConfigError(key, f"entry {item!r} is not of the form LISTENER_NAME:PROTOCOL")
        out[name.strip().upper()] = proto.strip().upper()
    return out


def _parse_listeners(key: str, text: str, protocol_map: Mapping[str, str]) -> list[EndPoint]:
    endpoints: list[EndPoint] = []
    for item in _parse_list(text):
        m = _LISTENER_RE.match(item)
        if m is None:
            raise ConfigError(key, f"listener {item!r} is not of the form NAME://host:port")
        name = m.group(1).upper()
        port = int(m.group(3))
        if not 0 <= port <= 65535:
            raise ConfigError(key, f"listener {item!r} has an invalid port {port}")
        if name not in protocol_map:
            raise ConfigError(
                key, f"listener name {name!r} is not in listener.security.protocol.map"
            )
        endpoints.append(EndPoint(name, m.group(2), port, protocol_map[name]))
    names = [e.listener_name for e in endpoints]
    if len(set(names)) != len(names):
        raise ConfigError(key, "each listener must have a different name")
    return endpoints


# ---------------------------------------------------------------------------------------------
# KafkaConfig
# ---------------------------------------------------------------------------------------------


class KafkaConfig:
    """A validated broker configuration.

    Every key is available as ``config.get("replica.lag.time.max.ms")``, as
    ``config["replica.lag.time.max.ms"]`` and as the attribute with dots replaced by
    underscores (``config.replica_lag_time_max_ms``). Keys whose value Kafka derives from
    several keys have their own properties (`log_dirs`, `log_retention_time_millis`, ...).
    """

    def __init__(self, props: Mapping[str, str] | None = None) -> None:
        self.originals: dict[str, str] = dict(props or {})
        values: dict[str, Any] = {}
        for key in self.originals:
            if key not in CONFIG_DEFS:
                raise ConfigError(key, "unknown configuration key")
        for name, spec in CONFIG_DEFS.items():
            if name in self.originals:
                try:
                    value = _PARSERS[spec.type](self.originals[name])
                except ValueError as e:
                    raise ConfigError(name, str(e)) from None
            else:
                value = list(spec.default) if isinstance(spec.default, list) else spec.default
            if spec.validator is not None:
                problem = spec.validator(value)
                if problem:
                    raise ConfigError(name, problem)
            values[name] = value
        self._values = values
        self._validate()

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def from_file(
        cls, path: str | Path, overrides: Sequence[str] | Mapping[str, str] = ()
    ) -> KafkaConfig:
        """Load `server.properties`, then apply `--override key=value` pairs."""
        props = load_properties(path)
        props.update(_overrides_dict(overrides))
        return cls(props)

    @classmethod
    def from_text(
        cls, text: str, overrides: Sequence[str] | Mapping[str, str] = ()
    ) -> KafkaConfig:
        props = parse_properties(text)
        props.update(_overrides_dict(overrides))
        return cls(props)

    def with_overrides(self, overrides: Sequence[str] | Mapping[str, str]) -> KafkaConfig:
        props = dict(self.originals)
        props.update(_overrides_dict(overrides))
        return KafkaConfig(props)

    # --- access -------------------------------------------------------------------------------

    def get(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            raise ConfigError(key, "unknown configuration key") from None

    def __getitem__(self, key: str) -> Any:
        return self.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        key = attr.replace("_", ".")
        values = self.__dict__.get("_values")
        if values is not None and key in values:
            return values[key]
        raise AttributeError(f"KafkaConfig has no attribute {attr!r}")

    def values(self) -> dict[str, Any]:
        return dict(self._values)

    def is_set(self, key: str) -> bool:
        """True when the key was given in the file or an override (not a default)."""
        return key in self.originals

    # --- derived values (Kafka's KafkaConfig getters) -----------------------------------------

    @property
    def log_dirs(self) -> list[str]:
        raw = self._values["log.dirs"]
        if raw is None:
            raw = self._values["log.dir"]
        return [d for d in _parse_list(raw) if d]

    @property
    def zk_connect(self) -> str:
        """zookeeper.connect, which a broker cannot start without."""
        v = self._values["zookeeper.connect"]
        if v is None:
            raise ConfigError("zookeeper.connect", "missing required configuration (no default)")
        return v

    @property
    def zk_connection_timeout_ms(self) -> int:
        v = self._values["zookeeper.connection.timeout.ms"]
        return v if v is not None else self._values["zookeeper.session.timeout.ms"]

    @property
    def listener_security_protocol_map(self) -> dict[str, str]:
        return _parse_protocol_map(
            "listener.security.protocol.map", self._values["listener.security.protocol.map"]
        )

    @property
    def listeners(self) -> list[EndPoint]:
        return _parse_listeners(
            "listeners", self._values["listeners"], self.listener_security_protocol_map
        )

    @property
    def advertised_listeners(self) -> list[EndPoint]:
        raw = self._values["advertised.listeners"]
        if raw is None:
            return self.listeners
        return _parse_listeners(
            "advertised.listeners", raw, self.listener_security_protocol_map
        )

    @property
    def inter_broker_listener_name(self) -> str:
        name = self._values["inter.broker.listener.name"]
        if name is not None:
            return name.upper()
        return self._values["security.inter.broker.protocol"]

    @property
    def log_retention_time_millis(self) -> int:
        """log.retention.ms, else .minutes, else .hours; negative means -1 (unlimited)."""
        ms = self._values["log.retention.ms"]
        if ms is None:
            minutes = self._values["log.retention.minutes"]
            if minutes is not None:
                ms = minutes * 60_000
            else:
                ms = self._values["log.retention.hours"] * 3_600_000
        return -1 if ms < 0 else ms

    @property
    def log_roll_time_millis(self) -> int:
        ms = self._values["log.roll.ms"]
        return ms if ms is not None else self._values["log.roll.hours"] * 3_600_000

    @property
    def log_roll_time_jitter_millis(self) -> int:
        ms = self._values["log.roll.jitter.ms"]
        return ms if ms is not None else self._values["log.roll.jitter.hours"] * 3_600_000

    @property
    def log_flush_interval_ms(self) -> int:
        ms = self._values["log.flush.interval.ms"]
        return ms if ms is not None else self._values["log.flush.scheduler.interval.ms"]

    def log_config(self) -> dict[str, Any]:
        """The topic-level LogConfig defaults Kafka derives from the broker's log keys.

        Keys are the topic-level names (`segment.bytes`, `retention.ms`, ...), values are typed
        (int/bool/float/str; `cleanup.policy` is the comma-separated string).
        """
        out: dict[str, Any] = {
            topic_key: self._values[broker_key]
            for topic_key, broker_key in _LOG_CONFIG_SYNONYMS.items()
        }
        out["segment.ms"] = self.log_roll_time_millis
        out["segment.jitter.ms"] = self.log_roll_time_jitter_millis
        out["flush.ms"] = self.log_flush_interval_ms
        out["retention.ms"] = self.log_retention_time_millis
        out["cleanup.policy"] = ",".join(out["cleanup.policy"])  # as a topic config string
        return dict(sorted(out.items()))

    # --- cross-key checks (Kafka's KafkaConfig.validateValues, the parts tidelog needs) -------

    def _validate(self) -> None:
        v = self._values
        threads = v["log.cleaner.threads"]
        if threads == 0 or v["log.cleaner.dedupe.buffer.size"] // threads <= 1024 * 1024:
            raise ConfigError(
                "log.cleaner.dedupe.buffer.size", "must be at least 1MB per cleaner thread.")
        if v["replica.fetch.wait.max.ms"] > v["replica.socket.timeout.ms"]:
            raise ConfigError(
                "replica.fetch.wait.max.ms",
                "must be less than or equal to replica.socket.timeout.ms",
            )
        if v["replica.fetch.wait.max.ms"] > v["replica.lag.time.max.ms"]:
            raise ConfigError(
                "replica.fetch.wait.max.ms",
                "must be less than or equal to replica.lag.time.max.ms"
                " to prevent frequent changes in ISR",
            )
        if v["broker.id"] > v["reserved.broker.max.id"] and v["broker.id.generation.enable"]:
            raise ConfigError(
                "broker.id",
                f"value {v['broker.id']} must not exceed reserved.broker.max.id"
                f" ({v['reserved.broker.max.id']}) while broker.id.generation.enable is true",
            )
        if v["broker.id"] < 0 and not v["broker.id.generation.enable"]:
            raise ConfigError("broker.id", "must be set when broker.id.generation.enable is false")
        if not self.log_dirs:
            raise ConfigError("log.dirs", "at least one log directory is required")
        _refuse_duplicate_log_dirs(self.log_dirs)
        protocol_map = self.listener_security_protocol_map
        listeners = self.listeners
        if not listeners:
            raise ConfigError("listeners", "at least one listener is required")
        for ep in listeners:
            if ep.security_protocol != "PLAINTEXT":
                raise ConfigError(
                    "listeners",
                    f"listener {ep.listener_name} uses {ep.security_protocol};"
                    " tidelog supports PLAINTEXT only",
                )
        ports = [ep.port for ep in listeners if ep.port != 0]
        if len(set(ports)) != len(ports):
            raise ConfigError("listeners", "each listener must have a different port")
        advertised = self.advertised_listeners
        for ep in advertised:
            if ep.host == "0.0.0.0":
                raise ConfigError(
                    "advertised.listeners", "0.0.0.0 is not a valid host to advertise"
                )
        ib_name = self.inter_broker_listener_name
        if v["inter.broker.listener.name"] is not None and ib_name not in protocol_map:
            raise ConfigError("inter.broker.listener.name", f"{ib_name!r} is not a known listener")
        if ib_name not in {ep.listener_name for ep in advertised}:
            raise ConfigError(
                "inter.broker.listener.name",
                f"listener {ib_name!r} is not among advertised.listeners",
            )
        if v["zookeeper.connect"] is not None and not v["zookeeper.connect"]:
            raise ConfigError("zookeeper.connect", "must not be empty")
        self._validate_log_defaults()

    def _validate_log_defaults(self) -> None:
        """The broker's log keys are the topics' defaults: the same values are refused (a
        feature tidelog does not implement), named by their broker key."""
        from tidelog.storage.log_config import LogConfig

        for topic_key, value in self.log_config().items():
            try:
                LogConfig.from_dict({topic_key: value})
            except ValueError as e:
                broker_key = _LOG_CONFIG_SYNONYMS.get(topic_key, topic_key)
                reason = str(e).split(f"for configuration {topic_key}: ", 1)[-1]
                raise ConfigError(broker_key, reason) from None

    def __repr__(self) -> str:
        return f"KafkaConfig(broker.id={self._values['broker.id']}, {len(self.originals)} set)"


def _overrides_dict(overrides: Sequence[str] | Mapping[str, str]) -> dict[str, str]:
    if isinstance(overrides, Mapping):
        return {str(k): str(val) for k, val in overrides.items()}
    return parse_overrides(overrides)
