"""`tidelog reassign` reads Kafka's reassignment JSON: `log_dirs` as long as `replicas`
(Kafka's message otherwise), and only `any` as a log dir — a plan choosing a replica's log dir
is refused before anything is sent, since tidelog brokers do not serve AlterReplicaLogDirs."""

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
    assert _read_plan(plan_file(tmp_path, log_dirs=["any"] * 3)) == {("moving", 0): [2, 3, 4]}
    assert _read_plan(plan_file(tmp_path)) == {("moving", 0): [2, 3, 4]}


@pytest.mark.parametrize("command", ["execute", "verify", "cancel"])
@pytest.mark.parametrize(("log_dirs", "message"), [
    (["any"], "Error: Size of replicas list [2, 3, 4] is different from size of log dirs list "
              "[any] for partition moving-0"),
    (["any", "/data/b", "any"], "Error: Failed to alter dir for moving-0-3: tidelog brokers do "
                                "not serve AlterReplicaLogDirs"),
])
def test_a_plan_naming_log_dirs_is_refused_before_anything_is_sent(
        tmp_path: Path, command: str, log_dirs: list[str], message: str) -> None:
    result = CliRunner().invoke(reassign, [
        command, "--bootstrap-server", NOWHERE,
        "--reassignment-json-file", plan_file(tmp_path, log_dirs=log_dirs)])
    assert result.exit_code == 1
    assert message in result.output
