"""The correctness scenarios of correctness.md: each passes with tidelog's rules, and each one
that replaced a naive rule is caught by the simulator when that naive rule is switched on."""

from __future__ import annotations

import pytest

from tidelog.sim.scenarios import SCENARIOS, run_scenario

FIXED = sorted(SCENARIOS)
NAIVE = sorted(n for n, s in SCENARIOS.items() if s.naive_rule is not None)


@pytest.mark.parametrize("name", FIXED)
def test_scenario_holds_with_tidelogs_rules(name: str) -> None:
    result = run_scenario(name)
    assert not result.unexpected, result.verdict()
    assert len(result.steps) >= 3  # the script really ran its steps
    assert result.notes == []  # and every state it waited for was reached


@pytest.mark.parametrize("name", NAIVE)
def test_naive_rule_is_caught_in_the_same_scenario(name: str) -> None:
    result = run_scenario(name, naive=True)
    assert result.caught, result.verdict()
    assert result.notes == []


def test_every_historic_bug_of_correctness_md_has_a_scenario() -> None:
    for name in ("kip101", "kip101_divergence", "kip279", "kip320", "kafka7164", "maximal_isr",
                 "kip841", "kip903", "kip966", "stale_fetch_response", "out_of_range",
                 "stale_controller"):
        assert name in SCENARIOS


def test_naive_acked_loss_scenarios_lose_acked_data() -> None:
    # Not only an invariant on the way: acknowledged records are really gone at the end.
    for name in ("kip101", "maximal_isr", "kip966"):
        result = run_scenario(name, naive=True)
        assert any(v.invariant == "NoAckedLoss" for v in result.violations), result.verdict()


def test_scenario_replays_identically() -> None:
    a = run_scenario("kip320")
    b = run_scenario("kip320")
    assert a.digest == b.digest
    assert [s.brokers for s in a.steps] == [s.brokers for s in b.steps]


def test_step_table_shows_every_broker_at_every_step() -> None:
    result = run_scenario("kip101")
    table = result.table()
    assert table.row_count == len(result.steps)
    assert len(table.columns) == 2 + 3 + 1  # step, time, three brokers, ZooKeeper
    labels = [s.label for s in result.steps]
    assert labels[0] == "boot" and labels[-1] == "healed"


def test_scenarios_without_a_naive_rule_refuse_naive_mode() -> None:
    with pytest.raises(ValueError, match="no naive rule"):
        run_scenario("stale_fetch_response", naive=True)
