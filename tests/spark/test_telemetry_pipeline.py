"""The replication-telemetry pipeline end to end on a short run: a 3-broker tidelog cluster with
`tidelog.replication.events.enable` and the legacy `replica.lag.max.messages` rule, a bursty
producer, then the Spark job of `examples/replication_telemetry.py` over `__replication_events`;
its per-partition report must equal the counts computed from the events read directly with
tidelog's consumer."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tidelog.broker.replication_events import ReplicationEvent, read_events

pytestmark = [pytest.mark.spark, pytest.mark.integration]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "replication_telemetry.py"


@pytest.fixture(scope="module")
def telemetry() -> ModuleType:
    spec = importlib.util.spec_from_file_location("replication_telemetry_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def legacy_cluster(telemetry: ModuleType, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Any]:
    from tidelog.cluster.local import LocalCluster

    cluster = LocalCluster(tmp_path_factory.mktemp("telemetry-cluster"))
    overrides = telemetry.policy_overrides("legacy", lag_max_messages=20, lag_time_max_ms=1500)
    overrides["replica.high.watermark.checkpoint.interval.ms"] = "500"
    cluster.up(3, overrides=overrides, timeout_s=120)
    try:
        yield cluster
    finally:
        cluster.down()


def expected_report(events: list[ReplicationEvent], end_ms: int) -> dict[tuple[str, int], dict]:
    """The report's numbers computed plainly from the events (in log order)."""
    out: dict[tuple[str, int], dict] = {}
    isr_events: dict[tuple[str, int], list[tuple[int, int, ReplicationEvent]]] = {}
    for offset, e in enumerate(events):
        row = out.setdefault((e.topic, e.partition), {
            "isr_shrinks": 0, "isr_expands": 0, "elections": 0, "hw_checkpoints": 0,
            "under_replicated_ms": 0})
        if e.type == "hw_checkpoint":
            row["hw_checkpoints"] += 1
            continue
        row[{"isr_shrink": "isr_shrinks", "isr_expand": "isr_expands",
             "leader_election": "elections"}[e.type]] += 1
        isr_events.setdefault((e.topic, e.partition), []).append((e.time_ms, offset, e))
    for key, evs in isr_events.items():
        evs.sort(key=lambda t: (t[0], t[1]))
        replicas = max(max(len(e.new_isr), len(e.old_isr)) for _, _, e in evs)
        out[key]["replicas"] = replicas
        for i, (t, _, e) in enumerate(evs):
            until = evs[i + 1][0] if i + 1 < len(evs) else max(end_ms, t)
            if len(e.new_isr) < replicas:
                out[key]["under_replicated_ms"] += until - t
    return out


def settled_events(bootstrap: str, topic: str, timeout_s: float = 60) -> list[ReplicationEvent]:
    """The events once both partitions of `topic` are back to their full ISR (the last ISR
    event of each has 3 members) and an HW checkpoint was written: the run's last expands and
    checkpoints are in."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = asyncio.run(read_events(bootstrap, timeout_s=30))
        last = {e.partition: e for e in events if e.topic == topic and e.type != "hw_checkpoint"}
        if any(e.type == "hw_checkpoint" for e in events) and \
                all(p in last and len(last[p].new_isr) == 3 for p in (0, 1)):
            return events
        assert time.monotonic() < deadline, f"events not settled in {timeout_s} s: {last}"
        time.sleep(0.5)


def test_report_matches_the_events_read_with_the_client(
    spark: Any, telemetry: ModuleType, legacy_cluster: Any
) -> None:
    bootstrap = legacy_cluster.bootstrap_servers
    start_ms = int(time.time() * 1000)
    asyncio.run(telemetry.create_topic(bootstrap, telemetry.DATA_TOPIC, 2, 3))
    produced, bursts = asyncio.run(telemetry.bursty_produce(
        bootstrap, telemetry.DATA_TOPIC, duration_s=8, burst=3000, pause_s=0.7, burst_rate=10_000))
    assert produced == 3000 * bursts and bursts >= 2
    events = settled_events(bootstrap, telemetry.DATA_TOPIC)
    end_ms = int(time.time() * 1000)
    assert {e.type for e in events} >= {"leader_election", "hw_checkpoint"}
    df = telemetry.load_events(spark, bootstrap, ending_offset=len(events))
    report = {(r["topic"], r["partition"]): r.asDict() for r in
              telemetry.telemetry_report(df, start_ms=start_ms, end_ms=end_ms).collect()}

    expected = expected_report(events, end_ms)
    assert set(report) == set(expected)
    for key, want in expected.items():
        got = report[key]
        assert {k: got[k] for k in want} == want, key
        hours = (end_ms - start_ms) / 3_600_000
        assert got["shrinks_per_hour"] == round(want["isr_shrinks"] / hours, 1)
    # The data topic: elected once per partition (its creation), led by the broker that wrote
    # the events about it; every shrink the legacy rule made on a burst was written by a leader.
    data = [report[(telemetry.DATA_TOPIC, p)] for p in (0, 1)]
    assert [r["elections"] for r in data] == [1, 1]
    assert all(r["replicas"] == 3 for r in data)
    shrinks = [e for e in events if e.type == "isr_shrink"]
    assert all(len(e.new_isr) < len(e.old_isr) and e.broker in e.old_isr for e in shrinks)
