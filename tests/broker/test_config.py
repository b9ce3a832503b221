from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.broker.config import (
    CONFIG_DEFS,
    ConfigError,
    EndPoint,
    KafkaConfig,
    parse_overrides,
    parse_properties,
)

REPO = Path(__file__).resolve().parents[2]


# --- Java properties syntax -------------------------------------------------------------------


def test_separators_equals_colon_and_whitespace() -> None:
    props = parse_properties("a=1\nb: 2\nc 3\nd\t=\t4\ne  :five\n")
    assert props == {"a": "1", "b": "2", "c": "3", "d": "4", "e": "five"}


def test_comments_blank_lines_and_leading_whitespace_are_skipped() -> None:
    text = "# a comment\n! another comment\n\n   \n   key = value\n\t# indented comment\n"
    assert parse_properties(text) == {"key": "value"}


def test_value_keeps_trailing_whitespace_and_later_separators() -> None:
    props = parse_properties("k = a=b:c  \n")
    assert props == {"k": "a=b:c  "}


def test_line_continuation_joins_lines_and_drops_leading_whitespace() -> None:
    text = "listeners=PLAINTEXT://127.0.0.1:9092,\\\n          REPL://127.0.0.1:9093\nnext=1\n"
    props = parse_properties(text)
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,REPL://127.0.0.1:9093"
    assert props["next"] == "1"


def test_even_number_of_backslashes_is_not_a_continuation() -> None:
    props = parse_properties("path=C:\\\\\nother=2\n")
    assert props == {"path": "C:\\", "other": "2"}


def test_comment_line_ending_in_backslash_does_not_continue() -> None:
    props = parse_properties("# comment \\\nkey=value\n")
    assert props == {"key": "value"}


def test_escapes_in_keys_and_values() -> None:
    text = "my\\ key\\=x = tab\\there\\nnl \\u0041\\u00e9 \\q\n"
    props = parse_properties(text)
    assert props == {"my key=x": "tab\there\nnl A\u00e9 q"}


def test_malformed_unicode_escape_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="line 2: malformed"):
        parse_properties("ok=1\nbad=\\u12G4\n")


def test_crlf_and_cr_line_endings_and_last_duplicate_wins() -> None:
    props = parse_properties("a=1\r\nb=2\rA=3\r\na=4")
    assert props == {"a": "4", "b": "2", "A": "3"}


def test_key_without_value_is_empty_string() -> None:
    assert parse_properties("flag\nother=\n") == {"flag": "", "other": ""}


# --- defaults ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "default"),
    [
        ("broker.id", -1),
        ("listeners", "PLAINTEXT://:9092"),
        ("advertised.listeners", None),
        ("log.dir", "/tmp/kafka-logs"),
        ("zookeeper.connect", None),
        ("zookeeper.session.timeout.ms", 18000),
        ("zookeeper.connection.timeout.ms", None),
        ("num.partitions", 1),
        ("default.replication.factor", 1),
        ("min.insync.replicas", 1),
        ("unclean.leader.election.enable", False),
        ("auto.create.topics.enable", True),
        ("replica.lag.time.max.ms", 30000),
        ("replica.lag.max.messages", None),
        ("replica.fetch.max.bytes", 1048576),
        ("replica.fetch.wait.max.ms", 500),
        ("replica.fetch.min.bytes", 1),
        ("replica.fetch.backoff.ms", 1000),
        ("replica.fetch.response.max.bytes", 10485760),
        ("num.replica.fetchers", 1),
        ("replica.high.watermark.checkpoint.interval.ms", 5000),
        ("socket.request.max.bytes", 104857600),
        ("connections.max.idle.ms", 600000),
        ("request.timeout.ms", 30000),
        ("controlled.shutdown.enable", True),
        ("auto.leader.rebalance.enable", True),
        ("leader.imbalance.check.interval.seconds", 300),
        ("leader.imbalance.per.broker.percentage", 10),
        ("delete.topic.enable", True),
        ("offsets.topic.replication.factor", 3),
        ("group.initial.rebalance.delay.ms", 3000),
        ("log.segment.bytes", 1073741824),
        ("log.retention.hours", 168),
        ("log.retention.bytes", -1),
        ("log.flush.interval.messages", 2**63 - 1),
        ("message.max.bytes", 1048588),
        ("log.index.interval.bytes", 4096),
        ("log.initial.task.delay.ms", 30000),
    ],
)
def test_kafka_defaults(key: str, default: object) -> None:
    assert KafkaConfig().get(key) == default


def test_derived_defaults() -> None:
    config = KafkaConfig()
    assert config.log_dirs == ["/tmp/kafka-logs"]
    assert config.zk_connection_timeout_ms == 18000
    assert config.listeners == [EndPoint("PLAINTEXT", "", 9092, "PLAINTEXT")]
    assert config.advertised_listeners == config.listeners
    assert config.inter_broker_listener_name == "PLAINTEXT"
    assert config.log_retention_time_millis == 168 * 3600 * 1000
    assert config.log_flush_interval_ms == 2**63 - 1
    with pytest.raises(ConfigError, match=r"^zookeeper\.connect: missing required"):
        _ = config.zk_connect


def test_every_defined_default_passes_its_own_validation() -> None:
    config = KafkaConfig()
    for name, spec in CONFIG_DEFS.items():
        if spec.validator is not None:
            assert spec.validator(config.get(name)) is None, name


# --- typed values, derived values and access --------------------------------------------------


def test_values_are_parsed_to_kafka_types_and_reachable_three_ways() -> None:
    config = KafkaConfig.from_text(
        "broker.id = 3\nunclean.leader.election.enable = TRUE\nlog.cleanup.policy= delete \n"
        "log.cleaner.min.cleanable.ratio=0.5\nreplica.lag.time.max.ms=10000\n"
    )
    assert config.get("broker.id") == 3
    assert config["unclean.leader.election.enable"] is True
    assert config.log_cleanup_policy == ["delete"]
    assert config.log_cleaner_min_cleanable_ratio == 0.5
    assert config.replica_lag_time_max_ms == 10000
    assert config.is_set("broker.id") and not config.is_set("num.partitions")
    with pytest.raises(AttributeError):
        _ = config.no_such_key


@pytest.mark.parametrize(
    ("text", "expected_ms"),
    [
        ("log.retention.hours=2", 2 * 3600_000),
        ("log.retention.hours=2\nlog.retention.minutes=3", 3 * 60_000),
        ("log.retention.hours=2\nlog.retention.minutes=3\nlog.retention.ms=7", 7),
        ("log.retention.ms=-5", -1),
    ],
)
def test_retention_precedence_ms_then_minutes_then_hours(text: str, expected_ms: int) -> None:
    config = KafkaConfig.from_text(text)
    assert config.log_retention_time_millis == expected_ms
    assert config.log_config()["retention.ms"] == expected_ms


def test_log_dirs_wins_over_log_dir_and_is_a_list() -> None:
    config = KafkaConfig.from_text("log.dir=/x\nlog.dirs=/a, /b\n")
    assert config.log_dirs == ["/a", "/b"]
    assert KafkaConfig.from_text("log.dir=/x").log_dirs == ["/x"]


def test_listeners_and_advertised_listeners() -> None:
    config = KafkaConfig.from_text(
        "listeners=PLAINTEXT://127.0.0.1:0,REPLICATION://127.0.0.1:9093\n"
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,REPLICATION:PLAINTEXT\n"
        "advertised.listeners=PLAINTEXT://localhost:9092,REPLICATION://localhost:9093\n"
        "inter.broker.listener.name=REPLICATION\n"
    )
    assert [e.connection_string for e in config.listeners] == [
        "PLAINTEXT://127.0.0.1:0",
        "REPLICATION://127.0.0.1:9093",
    ]
    assert config.advertised_listeners[1] == EndPoint("REPLICATION", "localhost", 9093, "PLAINTEXT")
    assert config.inter_broker_listener_name == "REPLICATION"


def test_log_config_maps_broker_keys_to_topic_keys() -> None:
    config = KafkaConfig.from_text(
        "log.segment.bytes=1024\nlog.roll.hours=1\nlog.flush.interval.ms=50\nmessage.max.bytes=900\n"
        "log.index.interval.bytes=100\nmin.insync.replicas=2\nunclean.leader.election.enable=true\n"
        "log.cleanup.policy=delete\nlog.retention.bytes=5000\n"
    )
    lc = config.log_config()
    assert lc["segment.bytes"] == 1024
    assert lc["segment.ms"] == 3600_000
    assert lc["flush.ms"] == 50
    assert lc["flush.messages"] == 2**63 - 1
    assert lc["max.message.bytes"] == 900
    assert lc["index.interval.bytes"] == 100
    assert lc["min.insync.replicas"] == 2
    assert lc["unclean.leader.election.enable"] is True
    assert lc["cleanup.policy"] == "delete"
    assert lc["retention.bytes"] == 5000
    assert lc["segment.index.bytes"] == 10 * 1024 * 1024
    assert not any(k.startswith("log.") for k in lc)


# --- files and overrides ----------------------------------------------------------------------


def test_file_then_overrides_win(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text("broker.id=1\nnum.partitions=3\nzookeeper.connect=127.0.0.1:2181\n")
    config = KafkaConfig.from_file(path, ["num.partitions=6", "zookeeper.connect=h:1/chroot=x"])
    assert config.broker_id == 1
    assert config.num_partitions == 6
    assert config.zk_connect == "h:1/chroot=x"
    again = config.with_overrides({"broker.id": "2"})
    assert (again.broker_id, again.num_partitions) == (2, 6)


def test_latin1_file_is_read_when_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_bytes("log.dir=/tmp/caf\xe9\n".encode("iso-8859-1"))
    assert KafkaConfig.from_file(path).log_dirs == ["/tmp/caf\u00e9"]


def test_missing_file_is_a_one_line_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read properties file") as info:
        KafkaConfig.from_file(tmp_path / "nope.properties")
    assert "\n" not in str(info.value)


def test_malformed_override_is_rejected() -> None:
    with pytest.raises(ConfigError, match="not of the form key=value"):
        parse_overrides(["num.partitions"])
    assert parse_overrides(["a=", "b=c=d"]) == {"a": "", "b": "c=d"}


def test_example_server_properties_loads() -> None:
    config = KafkaConfig.from_file(REPO / "config" / "server.properties")
    assert config.broker_id >= 0
    assert config.zk_connect
    assert config.listeners[0].host == "127.0.0.1"


def test_kafkas_stock_server_properties_keys_are_accepted() -> None:
    stock = """
broker.id=0
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600
log.dirs=/tmp/kafka-logs
num.partitions=1
num.recovery.threads.per.data.dir=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
log.retention.hours=168
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
zookeeper.connect=localhost:2181
zookeeper.connection.timeout.ms=18000
group.initial.rebalance.delay.ms=0
"""
    config = KafkaConfig.from_text(stock)
    assert config.offsets_topic_replication_factor == 1


# --- errors name the key, on one line ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ("no.such.key=1", "no.such.key", "unknown configuration key"),
        ("num.partitions=abc", "num.partitions", "not a valid int"),
        ("num.partitions=0", "num.partitions", "at least 1"),
        ("log.initial.task.delay.ms=-1", "log.initial.task.delay.ms", "at least 0"),
        ("broker.id=99999999999", "broker.id", "out of range"),
        ("auto.create.topics.enable=yes", "auto.create.topics.enable", "not a valid boolean"),
        ("log.cleaner.min.cleanable.ratio=half", "log.cleaner.min.cleanable.ratio", "double"),
        ("log.cleanup.policy=delete,shred", "log.cleanup.policy", "one of"),
        ("compression.type=brotli", "compression.type", "one of"),
        ("replica.lag.max.messages=0", "replica.lag.max.messages", "at least 1"),
        ("listeners=localhost:9092", "listeners", "NAME://host:port"),
        ("listeners=SSL://127.0.0.1:9093", "listeners", "PLAINTEXT only"),
        ("listeners=FOO://127.0.0.1:9093", "listeners", "not in listener.security.protocol.map"),
        ("listeners=PLAINTEXT://a:1,PLAINTEXT://b:2", "listeners", "different name"),
        ("advertised.listeners=PLAINTEXT://0.0.0.0:9092", "advertised.listeners", "0.0.0.0"),
        ("replica.fetch.wait.max.ms=20000\nreplica.lag.time.max.ms=10000",
         "replica.fetch.wait.max.ms", "replica.lag.time.max.ms"),
        ("broker.id=5000", "broker.id", "reserved.broker.max.id"),
        ("inter.broker.listener.name=OTHER", "inter.broker.listener.name", "OTHER"),
        ("log.dirs= , ", "log.dirs", "at least one"),
    ],
)
def test_invalid_configuration_is_a_one_line_error_naming_the_key(
    text: str, key: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        KafkaConfig.from_text(text)
    message = str(info.value)
    assert info.value.key == key
    assert message.startswith(f"{key}: ")
    assert fragment in message
    assert "\n" not in message


def test_the_log_cleaner_keys_are_read_and_checked() -> None:
    config = KafkaConfig.from_text(
        "zookeeper.connect=127.0.0.1:2181\nlog.cleanup.policy=compact,delete\n"
        "log.cleaner.min.compaction.lag.ms=5\nlog.cleaner.threads=2\n")
    assert config.log_config()["cleanup.policy"] == "compact,delete"
    assert config.log_config()["min.compaction.lag.ms"] == 5
    with pytest.raises(ConfigError, match="^log.cleaner.dedupe.buffer.size: must be at least 1MB"):
        KafkaConfig.from_text("zookeeper.connect=127.0.0.1:2181\nlog.cleaner.threads=2\n"
                              "log.cleaner.dedupe.buffer.size=2097152\n")


@pytest.mark.parametrize(("line", "key"), [
    ("log.preallocate=true", "log.preallocate"),
])
def test_log_defaults_of_unimplemented_features_are_refused_by_their_broker_key(
        line: str, key: str) -> None:
    with pytest.raises(ConfigError, match=f"^{key}: "):
        KafkaConfig.from_text(line)



@pytest.mark.parametrize(("dirs", "listed"), [
    ("{d}/a,{d}/a", "{d}/a, {d}/a"),
    ("{d}/a,{d}/a/", "{d}/a, {d}/a"),
    ("{d}//a,{d}/b,{d}/./a", "{d}/a, {d}/b, {d}/./a"),
    ("{d}/a,{d}/link", "{d}/a, {d}/link"),
])
def test_the_same_log_dir_twice_is_refused_as_kafka_refuses_it(
        tmp_path: Path, dirs: str, listed: str) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    for key in ("log.dirs", "log.dir"):
        with pytest.raises(ConfigError) as info:
            KafkaConfig.from_text(f"{key}={dirs.format(d=tmp_path)}\n")
        assert info.value.key is None
        assert str(info.value) == f"Duplicate log directory found: {listed.format(d=tmp_path)}"


def test_a_relative_log_dir_and_its_absolute_path_are_the_same_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        KafkaConfig.from_text(f"log.dirs=logs,{tmp_path}/logs\n")
    assert str(info.value) == f"Duplicate log directory found: {tmp_path}/logs, {tmp_path}/logs"
    assert KafkaConfig.from_text(f"log.dirs=logs,{tmp_path}/logs2\n").log_dirs == [
        "logs", f"{tmp_path}/logs2"]
