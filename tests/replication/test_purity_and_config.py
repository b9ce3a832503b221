"""The core stays pure (no clock, randomness, sockets, asyncio or ZooKeeper), and its config
reads Kafka's keys with clear errors."""

from __future__ import annotations

import ast
import pathlib

import pytest

import tidelog.replication
from tidelog.replication import ReplicationConfig

FORBIDDEN = {"asyncio", "socket", "kazoo", "time", "random", "threading", "datetime", "uvloop"}


def test_no_replication_module_imports_a_clock_randomness_or_io_framework() -> None:
    package = pathlib.Path(tidelog.replication.__file__).parent
    modules = sorted(package.glob("*.py"))
    assert len(modules) >= 10
    for path in modules:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


def test_config_from_kafka_properties() -> None:
    cfg = ReplicationConfig.from_properties(
        {"replica.lag.time.max.ms": "5000", "min.insync.replicas": 2,
         "unclean.leader.election.enable": "true", "log.dirs": "/ignored"},
        truncate_to_hw=True,
    )
    assert cfg.replica_lag_time_max_ms == 5000
    # A topic-level key: partitions read it from their log's LogConfig, not from here.
    assert not hasattr(cfg, "min_insync_replicas")
    assert cfg.unclean_leader_election_enable and cfg.truncate_to_hw
    assert cfg.replica_lag_max_messages is None and cfg.maximal_isr


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"replica.lag.time.max.ms": "soon"}, "replica.lag.time.max.ms: not an integer"),
        ({"replica.lag.time.max.ms": "0"}, "replica.lag.time.max.ms must be > 0"),
        ({"replica.lag.max.messages": "-1"}, "replica.lag.max.messages must be >= 0"),
    ],
)
def test_bad_config_values_fail_with_a_one_line_message(props: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplicationConfig.from_properties(props)
