"""`tidelog configs`: kafka-configs' --add-config syntax."""

from __future__ import annotations

import click
import pytest

from tidelog.cli.configs_cmd import parse_add_config


def test_add_config_syntax_is_kafka_configs() -> None:
    assert parse_add_config("retention.ms=1000,min.insync.replicas=2") == {
        "retention.ms": "1000", "min.insync.replicas": "2"}
    assert parse_add_config("cleanup.policy=[delete],segment.ms=5") == {
        "cleanup.policy": "delete", "segment.ms": "5"}
    assert parse_add_config("follower.replication.throttled.replicas=[0:1,1:2]") == {
        "follower.replication.throttled.replicas": "0:1,1:2"}
    assert parse_add_config("a=") == {"a": ""}


@pytest.mark.parametrize("bad", ["retention.ms", "=1", "a=[1,2", "a=[1]b"])
def test_bad_add_config_is_refused(bad: str) -> None:
    with pytest.raises(click.BadParameter):
        parse_add_config(bad)
