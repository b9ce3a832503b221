"""`tidelog sim`: random runs with a summary table, scenarios with a step table."""

from __future__ import annotations

from click.testing import CliRunner

from tidelog.cli.main import cli


def test_sim_runs_seeds_and_prints_a_summary() -> None:
    res = CliRunner().invoke(cli, ["sim", "--seed", "3", "--seeds", "2", "--steps", "800"],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "tidelog sim" in res.output and "2 runs" in res.output


def test_sim_scenario_trace_prints_every_replica_per_step() -> None:
    res = CliRunner().invoke(cli, ["sim", "--scenario", "kip101", "--trace"],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "LEO" in res.output and "m2 acked" in res.output and "no violation" in res.output


def test_sim_naive_scenario_exits_zero_when_the_bug_is_caught() -> None:
    res = CliRunner().invoke(cli, ["sim", "--scenario", "maximal_isr", "--naive"])
    assert res.exit_code == 0, res.output
    assert "bug caught" in res.output


def test_sim_rejects_unknown_faults_and_scenarios() -> None:
    res = CliRunner().invoke(cli, ["sim", "--faults", "meteor"])
    assert res.exit_code != 0 and "unknown fault" in res.output
    res = CliRunner().invoke(cli, ["sim", "--scenario", "nope"])
    assert res.exit_code != 0 and "unknown scenario" in res.output


def test_sim_lists_scenarios() -> None:
    res = CliRunner().invoke(cli, ["sim", "--list-scenarios"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "kip320" in res.output


def test_sim_scenario_all_runs_every_scenario_in_both_modes() -> None:
    from tidelog.sim.scenarios import SCENARIOS

    res = CliRunner().invoke(cli, ["sim", "--scenario", "all"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    lines = [line for line in res.output.splitlines() if line.startswith(("ok", "FAIL"))]
    expected = len(SCENARIOS) + sum(1 for s in SCENARIOS.values() if s.naive_rule)
    assert len(lines) == expected and all(line.startswith("ok") for line in lines)


def test_sim_single_seed_trace_replays_with_the_same_digest() -> None:
    res = CliRunner().invoke(cli, ["sim", "--seed", "4", "--steps", "600", "--trace"],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "leader_and_isr" in res.output and "trace digest" in res.output
    assert "DIFFERS" not in res.output


def test_sim_table_marks_each_seeds_transaction_verification() -> None:
    from tidelog.sim.runner import runs_txn_verification

    off = next(s for s in range(3, 400, 4) if not runs_txn_verification(s))
    res = CliRunner().invoke(cli, ["sim", "--seed", str(off - 1), "--seeds", "2", "--steps",
                                   "300"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    rows = {cells[0]: cells for cells in map(str.split, res.output.splitlines())
            if len(cells) == 11 and cells[0].isdigit() and cells[1].isdigit()}
    assert rows[str(off - 1)][8] == "-" and rows[str(off)][8] == "off"
    assert "txn: 1 runs (0 failed); verification off: 1 (0 failed)" in res.output
    forced = CliRunner().invoke(cli, ["sim", "--seed", "1", "--steps", "300", "--transactions",
                                      "--txn-verification", "on"], env={"COLUMNS": "200"})
    assert forced.exit_code == 0, forced.output
    assert "txn: 1 runs (0 failed); verification off: 0 (0 failed)" in forced.output


def test_a_failing_seeds_report_names_its_verification_setting_and_replay_options() -> None:
    from tidelog.sim.runner import RunSummary

    report = RunSummary(seed=7, txn_verification=False, log_dirs=2, converged=False,
                        replay_args=" --transactions").report()
    first = report.splitlines()[0]
    assert first.startswith("seed 7 (transactions, transaction.partition.verification.enable="
                            "false, 2 log dirs):")
    assert first.endswith("--steps <same steps> --transactions")
