"""`tidelog sim`: random simulation runs (one seed or many) and the named correctness scenarios.

    tidelog sim --seed 7 --steps 5000                 one seed, summary table
    tidelog sim --seed 1 --seeds 50 --steps 2000      seeds 1..50, progress bar, one row each
    tidelog sim --faults crash,pause --brokers 5      only these faults, five brokers
    tidelog sim --seeds 100 --transactions            the transactional workload on every seed
    tidelog sim --scenario kip101 --trace             a scripted scenario, step by step
    tidelog sim --scenario kip101 --naive --trace     the same with the rule it replaced
    tidelog sim --scenario all                        every scenario, fixed and naive
    tidelog sim --list-scenarios
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tidelog.sim.faults import ALL_FAULTS, DEFAULT_FAULTS


def _parse_faults(value: str) -> tuple[str, ...]:
    v = value.strip().lower()
    if v in ("default", ""):
        return DEFAULT_FAULTS
    if v == "all":
        return ALL_FAULTS
    if v == "none":
        return ()
    kinds = tuple(k.strip() for k in v.split(",") if k.strip())
    unknown = [k for k in kinds if k not in ALL_FAULTS]
    if unknown:
        raise click.BadParameter(f"unknown fault(s) {', '.join(unknown)}; choose from "
                                 f"{', '.join(ALL_FAULTS)}, default, all or none")
    return kinds


@click.command("sim")
@click.option("--seed", type=int, default=1, show_default=True, help="First (or only) seed.")
@click.option("--seeds", type=click.IntRange(1, 100_000), default=1, show_default=True,
              help="How many consecutive seeds to run, starting at --seed.")
@click.option("--steps", type=click.IntRange(1, 10_000_000), default=2000, show_default=True,
              help="Scheduler events per run before healing.")
@click.option("--brokers", type=click.IntRange(1, 9), default=3, show_default=True)
@click.option("--partitions", type=click.IntRange(1, 16), default=1, show_default=True)
@click.option("--faults", default="default", show_default=True,
              help=f"Comma-separated fault kinds ({', '.join(ALL_FAULTS)}), 'default' (= all), "
                   "'all' or 'none'.")
@click.option("--scenario", default=None,
              help="Run a named correctness scenario instead ('all': every scenario, with "
                   "tidelog's rules and with the naive rule).")
@click.option("--naive", is_flag=True, help="With --scenario: use the rule the fix replaced.")
@click.option("--naive-rule", default=None,
              help="Random runs with one naive rule switched on (truncate_to_hw, "
                   "no_epoch_fencing, committed_isr_hw, no_eligibility, reelect_unclean): "
                   "failing seeds show the simulator finds the bug unscripted.")
@click.option("--unclean", is_flag=True,
              help="Random runs with unclean leader election and min.insync.replicas=1: acked "
                   "data may be lost (allowed), replicas must still converge.")
@click.option("--transactions/--no-transactions", default=None,
              help="Run the transactional workload on every seed (or on none); default: one "
                   "seed in four, never with --unclean.")
@click.option("--txn-verification", type=click.Choice(["seed", "on", "off"]), default="seed",
              show_default=True,
              help="transaction.partition.verification.enable in transactional runs: drawn "
                   "from the seed (off in one in four), or on / off for every one.")
@click.option("--trace", "show_trace", is_flag=True,
              help="Print the step table (scenarios) or the run's trace (single seed).")
@click.option("--list-scenarios", is_flag=True, help="List the scenarios and exit.")
def sim(seed: int, seeds: int, steps: int, brokers: int, partitions: int, faults: str,
        scenario: str | None, naive: bool, naive_rule: str | None, unclean: bool,
        transactions: bool | None, txn_verification: str, show_trace: bool,
        list_scenarios: bool) -> None:
    """Deterministic simulation of a tidelog cluster: the real replication core and storage
    engine under a virtual clock, with seeded faults and invariant checks after every event."""
    console = Console()
    # Log recovery after simulated crashes and failed disks, fetchers failing over, refused
    # AlterPartitions retried: expected under the faults; their warnings and errors would drown
    # the table (the invariants say what went wrong).
    logging.getLogger("tidelog").setLevel(logging.CRITICAL)
    if list_scenarios or scenario is not None:
        from tidelog.sim.scenarios import SCENARIOS, run_scenario

        if list_scenarios:
            t = Table("scenario", "checks", "naive rule")
            for s in SCENARIOS.values():
                t.add_row(s.name, s.title, s.naive_rule or "-")
            console.print(t)
            return
        assert scenario is not None
        if scenario == "all":
            failed = 0
            for sc in SCENARIOS.values():
                for mode in (False, True):
                    if mode and sc.naive_rule is None:
                        continue
                    result = run_scenario(sc.name, naive=mode)
                    failed += not result.as_expected
                    mark = "ok  " if result.as_expected else "FAIL"
                    console.print(f"{mark} {result.verdict().splitlines()[0]}", markup=False,
                                  highlight=False)
            sys.exit(1 if failed else 0)
        if scenario not in SCENARIOS:
            raise click.BadParameter(f"unknown scenario {scenario!r}; one of "
                                     f"{', '.join(SCENARIOS)}", param_hint="--scenario")
        result = run_scenario(scenario, naive=naive)
        if show_trace:
            console.print(result.table())
        console.print(result.verdict())
        sys.exit(0 if result.as_expected else 1)

    kinds = _parse_faults(faults)
    from tidelog.sim.runner import (
        NAIVE_RULES,
        UNCLEAN_ALLOWED,
        naive_config,
        run_seed,
        unclean_config,
    )

    config = None
    allowed: tuple[str, ...] = ()
    if naive_rule is not None:
        if naive_rule not in NAIVE_RULES:
            raise click.BadParameter(f"unknown rule {naive_rule!r}; one of "
                                     f"{', '.join(NAIVE_RULES)}", param_hint="--naive-rule")
        config = naive_config(naive_rule)
    if unclean:
        config = unclean_config(config)
        allowed = UNCLEAN_ALLOWED

    verification = None if txn_verification == "seed" else txn_verification == "on"
    run_options: dict[str, Any] = dict(
        brokers=brokers, partitions=partitions, faults=kinds, config=config, allowed=allowed,
        transactions=transactions, txn_verification=verification)
    summaries = []
    with Progress(TextColumn("[bold]sim"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=console,
                  disable=seeds == 1, transient=True) as progress:
        task = progress.add_task("seeds", total=seeds, status="")
        for s in range(seed, seed + seeds):
            summary = run_seed(s, steps, **run_options)
            summaries.append(summary)
            failed = sum(1 for x in summaries if not x.ok)
            progress.update(task, advance=1, status=f"failed {failed}")
    # A plain fixed-width table: it must stay readable in an 80-column terminal and in CI logs.
    # txn: the transactional workload with KIP-890's verification on / off, "-" without it.
    head = ("seed", "events", "elect", "shrink", "expand", "acked", "lost", "viol", "txn",
            "result", "ev/s")
    fmt = "{:<8} {:>8} {:>5} {:>6} {:>6} {:>7} {:>4} {:>4} {:>3}  {:<8} {:>6}"
    lines = [fmt.format(*head), "-" * 78]
    shown = summaries if len(summaries) <= 200 else [x for x in summaries if not x.ok]

    def txn(x: Any) -> str:
        return "-" if x.txn_verification is None else "on" if x.txn_verification else "off"

    for x in shown:
        result = "FAIL" if not x.ok else "offline" if x.offline else "ok"
        lines.append(fmt.format(x.seed, x.events, x.elections, x.isr_shrinks, x.isr_expands,
                                x.acked, x.lost, len(x.violations), txn(x), result,
                                f"{x.events_per_s:,.0f}"))
    total_events = sum(x.events for x in summaries)
    total_wall = sum(x.wall_s for x in summaries)
    failed = sum(1 for x in summaries if not x.ok)
    lines.append("-" * 78)
    lines.append(fmt.format(
        f"{len(summaries)} runs", total_events, sum(x.elections for x in summaries),
        sum(x.isr_shrinks for x in summaries), sum(x.isr_expands for x in summaries),
        sum(x.acked for x in summaries), sum(x.lost for x in summaries),
        sum(len(x.violations) for x in summaries), "",
        f"{failed} FAIL" if failed else "all ok",
        f"{total_events / total_wall:,.0f}" if total_wall else "-"))
    txn_runs = [x for x in summaries if x.txn_verification is not None]
    if txn_runs:
        off = [x for x in txn_runs if not x.txn_verification]
        lines.append(
            f"txn: {len(txn_runs)} runs ({sum(not x.ok for x in txn_runs)} failed); "
            f"verification off: {len(off)} ({sum(not x.ok for x in off)} failed), late "
            f"appended {sum(x.late_appended for x in off)}/{sum(x.late_produces for x in off)}")
    console.print("tidelog sim", style="bold")
    for line in lines:
        console.print(line, markup=False, highlight=False)
    bad = [x for x in summaries if not x.ok]
    for x in bad[:5]:
        console.print(x.report(), markup=False, highlight=False)
    if show_trace and seeds == 1:
        # Replay the seed (same seed, same run) keeping its whole trace.
        replay = run_seed(seed, steps, full_trace=True, **run_options)
        for line in replay.trace_tail:
            console.print(line, markup=False, highlight=False)
        console.print(f"trace digest {replay.trace_digest}"
                      + ("" if replay.trace_digest == summaries[0].trace_digest
                         else " (DIFFERS from the first run: not deterministic)"))
    sys.exit(1 if bad else 0)
