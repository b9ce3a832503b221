"""`tidelog reassign` reads Kafka's reassignment JSON: `log_dirs` as long as `replicas`
(Kafka's message otherwise, before anything is sent); a dir other than `any` is a log dir move
for that replica."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tidelog.cli.reassign_cmd import _read_plan, reassign

NOWHERE = "127.0.0.1:9"  # never reached: the plan is refused first


def plan_file(tmp_path: Path, **partition: object) -> str:
    entry = {"topic": "moving", "partition": 0, "replicas": [2, 3, 4], **partition}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"version": 1, "partitions": [entry]}))
    return str(path)


def test_a_plan_with_any_log_dir_or_none_is_read(tmp_path: Path) -> None:
    assert _read_plan(plan_file(tmp_path, log_dirs=["any"] * 3)) == ({("moving", 0): [2, 3, 4]},
                                                                     {})
    assert _read_plan(plan_file(tmp_path)) == ({("moving", 0): [2, 3, 4]}, {})


def test_a_log_dir_other_than_any_is_a_move_of_that_replica(tmp_path: Path) -> None:
    assert _read_plan(plan_file(tmp_path, log_dirs=["any", "/data/b", "any"])) == (
        {("moving", 0): [2, 3, 4]}, {("moving", 0, 3): "/data/b"})


@pytest.mark.parametrize("command", ["execute", "verify", "cancel"])
def test_log_dirs_not_as_long_as_replicas_are_refused_before_anything_is_sent(
        tmp_path: Path, command: str) -> None:
    result = CliRunner().invoke(reassign, [
        command, "--bootstrap-server", NOWHERE,
        "--reassignment-json-file", plan_file(tmp_path, log_dirs=["any"])])
    assert result.exit_code == 1
    assert ("Error: Size of replicas list [2, 3, 4] is different from size of log dirs list "
            "[any] for partition moving-0") in result.output
