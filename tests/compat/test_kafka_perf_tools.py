"""Kafka 3.9's load and verification tools (kafka-producer-perf-test, kafka-consumer-perf-test,
kafka-verifiable-producer and -consumer, from kafka-tools) against Kafka and against tidelog:
what they report that does not depend on timing (records sent, acknowledged and consumed,
errors, the offsets a group committed) must be the same; rates and latencies are not compared."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import pytest
from differential import Pair, Target, create_ready, watermarks

from tidelog.testing.kafka_cluster import kafka_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PRODUCER_PERF = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER_PERF = "org.apache.kafka.tools.ConsumerPerformance"
VERIFIABLE_PRODUCER = "org.apache.kafka.tools.VerifiableProducer"
VERIFIABLE_CONSUMER = "org.apache.kafka.tools.VerifiableConsumer"
RECORDS = 2000


def run(main_class: str, *args: str) -> str:
    r = kafka_tool(main_class, *args, timeout_s=180)
    assert r.returncode == 0, f"{main_class}: {r.stderr[-2000:]}"
    errors = [line for line in r.stderr.splitlines() if " ERROR " in line]
    assert not errors, errors
    return r.stdout


def test_producer_then_consumer_perf_test(pair: Pair) -> None:
    def scenario(t: Target) -> dict[str, Any]:
        create_ready(t, "perf", 3, 3)
        out = run(PRODUCER_PERF, "--topic", "perf", "--num-records", str(RECORDS),
                  "--record-size", "100", "--throughput", "-1", "--producer-props",
                  f"bootstrap.servers={t.bootstrap}", "acks=all", "linger.ms=5")
        # The last line: "2000 records sent, <rate> records/sec (...), <latencies>".
        sent = re.match(r"(\d+) records sent, ", out.strip().splitlines()[-1])
        stored = sum(watermarks(t, "perf", p)[1] for p in range(3))
        out = run(CONSUMER_PERF, "--bootstrap-server", t.bootstrap, "--topic", "perf",
                  "--messages", str(RECORDS), "--timeout", "60000", "--group", "perf-group")
        # A header, then one row: start, end, MB consumed, MB/s, records consumed, records/s, ...
        header, row = out.strip().splitlines()[-2:]
        columns = dict(zip([c.strip() for c in header.split(",")],
                           [c.strip() for c in row.split(",")], strict=True))
        return {"sent": sent and int(sent.group(1)), "stored": stored,
                "consumed MB": columns["data.consumed.in.MB"],
                "consumed records": columns["data.consumed.in.nMsg"]}

    assert pair.same(scenario) == {"sent": RECORDS, "stored": RECORDS,
                                   "consumed MB": "0.1907", "consumed records": str(RECORDS)}


def _events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_verifiable_producer_then_verifiable_consumer(pair: Pair) -> None:
    n = 500

    def scenario(t: Target) -> dict[str, Any]:
        create_ready(t, "verifiable", 3, 3)
        produced = _events(run(VERIFIABLE_PRODUCER, "--bootstrap-server", t.bootstrap,
                               "--topic", "verifiable", "--max-messages", str(n), "--acks", "-1"))
        names = Counter(e["name"] for e in produced)
        acked = sorted(int(e["value"]) for e in produced if e["name"] == "producer_send_success")
        tool_data = next(e for e in produced if e["name"] == "tool_data")
        # Per partition, the acknowledged offsets are 0..k-1 (no gap, no duplicate).
        offsets: dict[int, list[int]] = {}
        for e in produced:
            if e["name"] == "producer_send_success":
                offsets.setdefault(e["partition"], []).append(e["offset"])
        contiguous = all(sorted(o) == list(range(len(o))) for o in offsets.values())

        # Without --enable-autocommit it commits after each batch it reads (commitSync).
        consumed = _events(run(VERIFIABLE_CONSUMER, "--bootstrap-server", t.bootstrap,
                               "--topic", "verifiable", "--group-id", "verifiable-group",
                               "--max-messages", str(n), "--reset-policy", "earliest"))
        records = [e for e in consumed if e["name"] == "records_consumed"]
        commits = [e for e in consumed if e["name"] == "offsets_committed"]
        last_committed: dict[int, int] = {}
        for c in commits:
            for o in c["offsets"]:
                last_committed[o["partition"]] = o["offset"]
        assigned = sorted(p["partition"] for e in consumed if e["name"] == "partitions_assigned"
                          for p in e["partitions"])
        return {
            "producer events": sorted(names.items()),
            "acked values": acked == list(range(n)),
            "offsets contiguous per partition": contiguous,
            "tool_data": (tool_data["sent"], tool_data["acked"]),
            "consumed": sum(r["count"] for r in records),
            "commits succeeded": all(c["success"] for c in commits) and bool(commits),
            "committed offsets sum": sum(last_committed.values()),
            "assigned": assigned,
            "consumer events": sorted({e["name"] for e in consumed}),
        }

    got = pair.same(scenario)
    assert got["tool_data"] == (n, n) and got["consumed"] == n
    assert got["committed offsets sum"] == n and got["assigned"] == [0, 1, 2]
