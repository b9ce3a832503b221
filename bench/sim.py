"""Simulator speed: scheduler events per second of wall time, with the invariants checked after
every event (the way the tests and `tidelog sim` run) and without them.

    python bench/sim.py [--seeds 20] [--steps 5000] [--append docs/benchmarks.md]

Goal (Step 2 issue): >= 20,000 simulated events per second on this machine.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import time
from datetime import UTC, datetime

from tidelog.sim.cluster import SimConfig
from tidelog.sim.runner import run_seed


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    ram = "?"
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            ram = f"{kb / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return (f"nproc {os.cpu_count()}, CPU {cpu}, RAM {ram}, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")


def measure(seeds: int, steps: int, brokers: int, partitions: int,
            check: bool) -> tuple[int, float, float, int]:
    events = 0
    wall = cpu = 0.0
    failed = 0
    for seed in range(seeds):
        config = SimConfig(check_invariants=check)
        t0, c0 = time.perf_counter(), time.process_time()
        # settle_ms=1: measure the faulty phase, not the quiet convergence wait after it.
        s = run_seed(seed, steps, brokers=brokers, partitions=partitions, config=config,
                     settle_ms=1)
        wall += time.perf_counter() - t0
        cpu += time.process_time() - c0
        events += s.events
        failed += bool(s.event_violations)
    return events, wall, cpu, failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--append", metavar="FILE", help="append a results section to FILE")
    args = ap.parse_args()
    logging.getLogger("tidelog.storage").setLevel(logging.ERROR)
    rows = []
    for brokers, partitions in ((3, 1), (5, 3)):
        for check in (True, False):
            events, wall, cpu, failed = measure(args.seeds, args.steps, brokers, partitions,
                                                check)
            rows.append((brokers, partitions, "on" if check else "off", events, wall,
                         events / wall if wall else 0.0, events / cpu if cpu else 0.0, failed))
    lines = [
        f"### run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Machine: {machine()}.",
        f"Command: `python bench/sim.py --seeds {args.seeds} --steps {args.steps}` (the default "
        "fault set, acks=all + acks=1 producers and a consumer per partition; wall time of the "
        "faulty phase of each run).",
        "",
        f"Load average at the start: {os.getloadavg()[0]:.1f} (the machine is shared; events per "
        "CPU-second is the less noisy figure).",
        "",
        "| brokers | partitions | invariants | events | wall s | events/s (wall) "
        "| events/s (CPU) | runs with per-event violations |",
        "|---:|---:|:---:|---:|---:|---:|---:|---:|",
    ]
    for b, p, chk, ev, wall, rate, cpu_rate, failed in rows:
        lines.append(f"| {b} | {p} | {chk} | {ev:,} | {wall:.2f} | {rate:,.0f} | {cpu_rate:,.0f} "
                     f"| {failed} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
