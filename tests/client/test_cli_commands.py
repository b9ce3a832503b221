"""`tidelog produce` and `tidelog consume` against the real tansu broker.

(Here rather than under tests/cli/ because they need this directory's broker fixture.)
"""

from __future__ import annotations

import asyncio
import json

from click.testing import CliRunner

from tidelog.cli.main import cli
from tidelog.client.cluster import KafkaClient, NewTopic
from tidelog.cluster.zookeeper import pick_free_port


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    async def main() -> None:
        async with KafkaClient(bootstrap) as client:
            assert await client.create_topics([NewTopic(name, partitions, 1)]) == {name: None}

    asyncio.run(main())


def run(*args: str, input: str | None = None):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def test_generated_records_round_trip_as_json(tansu: str, topic_name: str) -> None:
    create_topic(tansu, topic_name, 3)
    produced = run(
        "produce",
        "--bootstrap-server",
        tansu,
        "--topic",
        topic_name,
        "--count",
        "300",
        "--size",
        "12",
        "--compression",
        "lz4",
    )
    assert produced.exit_code == 0, produced.output
    assert "records/s" in produced.output and "p99 latency" in produced.output
    cells = [line.split("│")[1:-1] for line in produced.output.splitlines() if "│" in line]
    records, acked, errors = (c.strip() for c in cells[-1][:3])
    assert (records, acked, errors) == ("300", "300", "0")
    consumed = run(
        "consume",
        "--bootstrap-server",
        tansu,
        "--topic",
        topic_name,
        "--from-beginning",
        "--max-messages",
        "300",
        "--format",
        "json",
    )
    assert consumed.exit_code == 0, consumed.output
    records = [json.loads(line) for line in consumed.output.splitlines()]
    assert len(records) == 300
    assert {r["partition"] for r in records} <= {0, 1, 2}
    assert all(len(r["value"]) == 12 and r["value"].isupper() for r in records)
    per_partition: dict[int, list[int]] = {}
    for r in records:
        per_partition.setdefault(r["partition"], []).append(r["offset"])
    assert all(offsets == list(range(len(offsets))) for offsets in per_partition.values())


def test_stdin_lines_with_a_key_to_one_partition(tansu: str, topic_name: str) -> None:
    create_topic(tansu, topic_name, 2)
    lines = ["first line", "second", "ünïcode", ""]
    produced = run(
        "produce",
        "--bootstrap-server",
        tansu,
        "--topic",
        topic_name,
        "--partition",
        "1",
        "--key",
        "k1",
        "--acks",
        "1",
        input="\n".join(lines) + "\n",
    )
    assert produced.exit_code == 0, produced.output
    consumed = run(
        "consume",
        "--bootstrap-server",
        tansu,
        "--topic",
        topic_name,
        "--partition",
        "1",
        "--offset",
        "0",
        "--timeout-ms",
        "500",
    )
    assert consumed.exit_code == 0, consumed.output
    assert consumed.output.split("\n")[:4] == lines
    table = run(
        "consume",
        "--bootstrap-server",
        tansu,
        "--topic",
        topic_name,
        "--partition",
        "1",
        "--offset",
        "1",
        "--max-messages",
        "1",
        "--format",
        "table",
    )
    assert table.exit_code == 0, table.output
    assert "offset" in table.output and "second" in table.output and "k1" in table.output
    assert "first line" not in table.output
    nothing = run(
        "consume",
        "--bootstrap-server",
        tansu,
        "--topic",
        topic_name,
        "--partition",
        "0",
        "--from-beginning",
        "--timeout-ms",
        "300",
    )
    assert nothing.exit_code == 0 and nothing.output == ""


def test_bad_input_is_one_line_and_exit_status_one(tansu: str, topic_name: str) -> None:
    dead = f"127.0.0.1:{pick_free_port()}"
    cases = [
        (["consume", "--bootstrap-server", tansu, "--topic", topic_name], "does not exist"),
        (
            ["produce", "--bootstrap-server", tansu, "--topic", topic_name, "--count", "1"],
            "does not exist",
        ),
        (["consume", "--bootstrap-server", dead, "--topic", "t"], "cannot reach"),
        (
            ["produce", "--bootstrap-server", "no-port", "--topic", "t", "--count", "1"],
            "bad bootstrap server",
        ),
        (
            [
                "consume",
                "--bootstrap-server",
                tansu,
                "--topic",
                "t",
                "--from-beginning",
                "--offset",
                "3",
            ],
            "mutually exclusive",
        ),
        (
            [
                "produce",
                "--bootstrap-server",
                tansu,
                "--topic",
                "t",
                "--acks",
                "1",
                "--idempotence",
                "--count",
                "1",
            ],
            "requires --acks all",
        ),
        (
            [
                "produce",
                "--bootstrap-server",
                tansu,
                "--topic",
                "t",
                "--count",
                "1",
                "--throughput",
                "0",
            ],
            "must be positive",
        ),
    ]
    for args, message in cases:
        result = run(*args)
        assert result.exit_code == 1, (args, result.output)
        assert error_lines(result.output) == [error_lines(result.output)[0]], result.output
        assert message in result.output, (args, result.output)
    create_topic(tansu, topic_name, 1)
    result = run("consume", "--bootstrap-server", tansu, "--topic", topic_name, "--partition", "4")
    assert result.exit_code == 1 and "no partition 4" in result.output


def test_help_explains_every_option_with_its_default() -> None:
    produce = " ".join(run("produce", "--help").output.split())
    for text in (
        "--acks",
        "default: all",
        "--compression",
        "default: none",
        "--count",
        "--size",
        "default: 100",
        "--key",
        "--partition",
        "--linger-ms",
        "--throughput",
    ):
        assert text in produce
    consume = " ".join(run("consume", "--help").output.split())
    for text in (
        "--from-beginning",
        "--offset",
        "--max-messages",
        "--timeout-ms",
        "default: 10000",
        "--format",
        "default: value",
    ):
        assert text in consume
