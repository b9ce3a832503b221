"""`tidelog sim`: random simulation runs (one seed or many) and the named correctness scenarios.

    tidelog sim --seed 7 --steps 5000                 one seed, summary table
    tidelog sim --seed 1 --seeds 50 --steps 2000      seeds 1..50, progress bar, one row each
    tidelog sim --faults crash,pause --brokers 5      only these faults, five brokers
    tidelog sim --scenario kip101 --trace             a scripted scenario, step by step
    tidelog sim --scenario kip101 --naive --trace     the same with the rule it replaced
    tidelog sim --list-scenarios
"""

from __future__ import annotations

import logging
import sys

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tidelog.sim.faults import ALL_FAULTS


def _parse_faults(value: str) -> tuple[str, ...]:
    v = value.strip().lower()
    if v in ("all", ""):
        return ALL_FAULTS
    if v == "none":
        return ()
    kinds = tuple(k.strip() for k in v.split(",") if k.strip())
    unknown = [k for k in kinds if k not in ALL_FAULTS]
    if unknown:
        raise click.BadParameter(f"unknown fault(s) {', '.join(unknown)}; choose from "
                                 f"{', '.join(ALL_FAULTS)}, all or none")
    return kinds


@click.command("sim")
@click.option("--seed", type=int, default=1, show_default=True, help="First (or only) seed.")
@click.option("--seeds", type=click.IntRange(1, 100_000), default=1, show_default=True,
              help="How many consecutive seeds to run, starting at --seed.")
@click.option("--steps", type=click.IntRange(1, 10_000_000), default=2000, show_default=True,
              help="Scheduler events per run before healing.")
@click.option("--brokers", type=click.IntRange(1, 9), default=3, show_default=True)
@click.option("--partitions", type=click.IntRange(1, 16), default=1, show_default=True)
@click.option("--faults", default="all", show_default=True,
              help=f"Comma-separated fault kinds ({', '.join(ALL_FAULTS)}), 'all' or 'none'.")
@click.option("--scenario", default=None, help="Run a named correctness scenario instead.")
@click.option("--naive", is_flag=True, help="With --scenario: use the rule the fix replaced.")
@click.option("--trace", "show_trace", is_flag=True,
              help="Print the step table (scenarios) or the run's trace (single seed).")
@click.option("--list-scenarios", is_flag=True, help="List the scenarios and exit.")
def sim(seed: int, seeds: int, steps: int, brokers: int, partitions: int, faults: str,
        scenario: str | None, naive: bool, show_trace: bool, list_scenarios: bool) -> None:
    """Deterministic simulation of a tidelog cluster: the real replication core and storage
    engine under a virtual clock, with seeded faults and invariant checks after every event."""
    console = Console()
    # Log recovery after simulated crashes is expected here; its warnings would drown the table.
    logging.getLogger("tidelog.storage").setLevel(logging.ERROR)
    if list_scenarios or scenario is not None:
        from tidelog.sim.scenarios import SCENARIOS, run_scenario

        if list_scenarios:
            t = Table("scenario", "checks", "naive rule")
            for s in SCENARIOS.values():
                t.add_row(s.name, s.title, s.naive_rule or "-")
            console.print(t)
            return
        assert scenario is not None
        if scenario not in SCENARIOS:
            raise click.BadParameter(f"unknown scenario {scenario!r}; one of "
                                     f"{', '.join(SCENARIOS)}", param_hint="--scenario")
        result = run_scenario(scenario, naive=naive)
        if show_trace:
            console.print(result.table())
        console.print(result.verdict())
        sys.exit(0 if result.as_expected else 1)

    kinds = _parse_faults(faults)
    from tidelog.sim.runner import run_seed

    summaries = []
    with Progress(TextColumn("[bold]sim"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=console,
                  disable=seeds == 1, transient=True) as progress:
        task = progress.add_task("seeds", total=seeds, status="")
        for s in range(seed, seed + seeds):
            summary = run_seed(s, steps, brokers=brokers, partitions=partitions, faults=kinds)
            summaries.append(summary)
            failed = sum(1 for x in summaries if not x.ok)
            progress.update(task, advance=1, status=f"failed {failed}")
    table = Table("seed", "events", "virt s", "elect", "shrink", "expand", "acked", "lost",
                  "viol", "conv", "ev/s", title="tidelog sim")
    for x in summaries[:200] if len(summaries) <= 200 else [x for x in summaries if not x.ok]:
        table.add_row(str(x.seed), str(x.events), f"{x.virtual_ms / 1000:.1f}",
                      str(x.elections), str(x.isr_shrinks), str(x.isr_expands), str(x.acked),
                      str(x.lost), str(len(x.violations)),
                      ("yes" if x.converged else "NO") + (" (offline)" if x.offline else ""),
                      f"{x.events_per_s:,.0f}")
    total_events = sum(x.events for x in summaries)
    total_wall = sum(x.wall_s for x in summaries)
    table.add_section()
    table.add_row(f"{len(summaries)} run(s)", str(total_events), "",
                  str(sum(x.elections for x in summaries)),
                  str(sum(x.isr_shrinks for x in summaries)),
                  str(sum(x.isr_expands for x in summaries)),
                  str(sum(x.acked for x in summaries)), str(sum(x.lost for x in summaries)),
                  str(sum(len(x.violations) for x in summaries)),
                  str(sum(1 for x in summaries if x.converged)),
                  f"{total_events / total_wall:,.0f}" if total_wall else "-")
    console.print(table)
    bad = [x for x in summaries if not x.ok]
    for x in bad[:5]:
        console.print(x.report(), markup=False, highlight=False)
    if show_trace and seeds == 1:
        from tidelog.sim.runner import run_seed as again

        replay = again(seed, steps, brokers=brokers, partitions=partitions, faults=kinds,
                       tail=10_000)
        if replay.trace_tail:
            for line in replay.trace_tail:
                console.print(line, markup=False, highlight=False)
        else:
            console.print(f"trace digest {replay.trace_digest} (no failure: trace not printed)")
    sys.exit(1 if bad else 0)
