"""Where one acks=all record's CPU goes, step by step, in the brokers themselves (issue 12 item 1).

    .venv/bin/python bench/round_trip_steps.py [--records 3000] [--rounds 3]

bench/replication_cost.py gives the brokers' CPU per record with one record in flight; this
splits it by broker role and by step. A 3-broker tidelog cluster, a 1-partition RF=3 topic
(min.insync.replicas=2), one 1 KiB acks=all record at a time (linger.ms=0): per record the
leader handles the produce and each follower's fetch, each follower one fetch answer.

Two clusters, measured in turn in each round (``--rounds``, medians reported):

1. plain: the CPU per record of the leader and of each follower (/proc/<pid>/stat);
2. instrumented: each broker process imports a `sitecustomize` (a temporary directory put first
   on PYTHONPATH, so the brokers' code is not touched) that wraps the named synchronous steps
   below (`STEPS`) to add up their thread CPU time (time.thread_time_ns) and calls; SIGUSR1
   resets the counters after the warm-up, SIGUSR2 writes them out. Figures are inclusive
   (a step holds the steps it calls) and carry the wrapper's own cost (two clock reads, ~1-3 µs
   a call, which nested steps add to their parents); the instrumented cluster's CPU per record
   is printed next to the plain one's. What no step holds (the event
   loop, task wake-ups, the async handlers' own code, the kernel's receive path) is the rest.

Prints the tables; nothing is written to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import confluent_kafka
from _baseline import environment
from _machine import cpu_seconds, load_average, machine_description
from cluster import (
    RF3_CONFIG,
    STAMP,
    broker_pids,
    create_topic,
    leader_of,
    payload,
    prime_topic,
    producer_config,
    start_tidelog,
)

ROOT = Path(__file__).resolve().parent.parent
WARMUP_RECORDS = 300

# (module, class or "" for a module function, attribute, label). A staticmethod cannot be
# wrapped this way (the wrapper would be bound).
STEPS: list[tuple[str, str, str, str]] = [
    ("tidelog.broker.socket_server", "_Connection", "buffer_updated",
     "request frame read (protocol callback)"),
    ("tidelog.broker.socket_server", "", "decode_request", "request decode"),
    ("tidelog.broker.socket_server", "", "_encode", "answer encode"),
    ("asyncio", "StreamWriter", "writelines", "answer socket write"),
    ("tidelog.broker.socket_server", "_ResponseQueue", "_on_ready",
     "acks=all answer, once replicated (build, encode, write)"),
    ("tidelog.broker.kafka_apis", "KafkaApis", "_produce_response", "produce answer build"),
    ("tidelog.broker.replica_manager", "BrokerReplicaManager", "append_records",
     "produce: append_records (validate, append, delayed produce, held fetches woken)"),
    ("tidelog.replication.replica_manager", "ReplicaManager", "append_records",
     "core append_records"),
    ("tidelog.storage.log", "Log", "append_as_leader", "log append as leader"),
    ("tidelog.shell.replica_manager", "ReplicaManager", "fetch_messages",
     "fetch: shell fetch_messages (read, follower state, HW, completions)"),
    ("tidelog.replication.replica_manager", "ReplicaManager", "_read_from_local_log",
     "fetch: core _read_from_local_log"),
    ("tidelog.storage.log", "Log", "read_slice", "fetch: log read"),
    ("tidelog.replication.partition", "Partition", "update_follower_fetch_state",
     "fetch: follower fetch state (ISR, HW)"),
    ("tidelog.replication.replica_manager", "ReplicaManager", "replay_follower_fetches",
     "fetch: replay_follower_fetches"),
    ("tidelog.replication.replica_manager", "ReplicaManager", "_drain",
     "core _drain (listeners, delayed produce/fetch checks)"),
    ("tidelog.shell.replica_manager", "ReplicaManager", "complete_delayed",
     "shell complete_delayed"),
    ("tidelog.broker.fetch_session", "FetchManager", "new_context", "fetch session: new_context"),
    ("tidelog.broker.fetch_session", "FetchManager", "mark_changed",
     "fetch session: mark_changed (wakes held fetches)"),
    ("tidelog.broker.fetch_session", "IncrementalFetchContext", "update_and_generate_response",
     "fetch session: update_and_generate_response"),
    ("tidelog.broker.kafka_apis", "KafkaApis", "_partitions_to_read",
     "fetch: _partitions_to_read"),
    ("tidelog.broker.kafka_apis", "KafkaApis", "_nothing_for_follower",
     "fetch: _nothing_for_follower"),
    ("tidelog.client.connection", "BrokerConnection", "_on_read",
     "follower: answer frame read (protocol callback)"),
    ("tidelog.client.connection", "", "decode_response", "follower: answer decode"),
    ("tidelog.broker.fetcher_manager", "BrokerLeaderEndPoint", "_answered",
     "follower: answer callback (process, then next fetch)"),
    ("tidelog.broker.fetcher_manager", "", "from_wire", "follower: from_wire"),
    ("tidelog.replication.fetcher", "ReplicaFetcher", "process_fetch_response",
     "follower: process_fetch_response"),
    ("tidelog.storage.log", "Log", "append_as_follower", "follower: log append"),
    ("tidelog.broker.fetcher_manager", "BrokerLeaderEndPoint", "_start",
     "follower: next fetch sent (_start)"),
    ("tidelog.replication.fetcher", "ReplicaFetcher", "build_fetch", "follower: build_fetch"),
    ("tidelog.broker.fetcher_manager", "", "to_wire", "follower: to_wire"),
    ("tidelog.client.connection", "BrokerConnection", "_write",
     "follower: request encode + write"),
]

SITECUSTOMIZE = '''
import functools, importlib, json, os, signal, time

_acc = {}
_clock = time.thread_time_ns


def _wrap(module, owner, attr, label):
    target = importlib.import_module(module)
    if owner:
        target = getattr(target, owner)
    fn = getattr(target, attr)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        start = _clock()
        try:
            return fn(*args, **kwargs)
        finally:
            entry = _acc.get(label)
            if entry is None:
                entry = _acc[label] = [0, 0]
            entry[0] += 1
            entry[1] += _clock() - start

    setattr(target, attr, timed)


for _step in json.loads(os.environ["ROUND_TRIP_STEPS"]):
    _wrap(*_step)


def _dump(*_):
    with open(os.path.join(os.environ["ROUND_TRIP_STEPS_OUT"], f"{os.getpid()}.json"), "w") as f:
        json.dump(_acc, f)


signal.signal(signal.SIGUSR1, lambda *_: _acc.clear())
signal.signal(signal.SIGUSR2, _dump)
'''


class Run:
    """A cluster with the topic, its leader and a producer keeping one record in flight."""

    def __init__(self, workdir: Path) -> None:
        self.cluster = start_tidelog(workdir)
        bootstrap = self.cluster.bootstrap_servers
        create_topic(bootstrap, "steps", 1, 3, RF3_CONFIG)
        prime_topic(bootstrap, "steps", 1)
        self.leader = leader_of(bootstrap, "steps", 0)
        self.pids = broker_pids(self.cluster)
        self.producer = confluent_kafka.Producer(producer_config(bootstrap, **{"linger.ms": 0}))
        self.record = STAMP.pack(0) + payload(1024)

    def send(self, n: int) -> None:
        for _ in range(n):
            self.producer.produce("steps", self.record, partition=0)
            if self.producer.flush(30):
                raise RuntimeError("a record was not delivered in 30 s")

    def measure(self, records: int) -> dict[int, float]:
        """CPU µs per record of each broker over ``records`` records."""
        before = {b: cpu_seconds(pid) for b, pid in self.pids.items()}
        self.send(records)
        return {b: (cpu_seconds(pid) - before[b]) * 1e6 / records
                for b, pid in self.pids.items()}

    def down(self) -> None:
        self.cluster.down(timeout_s=20)


def by_role(leader: int, per_broker: dict[int, float]) -> list[tuple[str, float]]:
    """[("leader", x), ("follower", y), ("follower", z)], the followers in ascending order
    (the two passes' clusters elect their own leader)."""
    followers = sorted(us for b, us in per_broker.items() if b != leader)
    return [("leader", per_broker[leader])] + [("follower", us) for us in followers]


def start_instrumented(workdir: Path, site: Path, out: Path) -> Run:
    """A cluster whose brokers import the step counters (`SITECUSTOMIZE`)."""
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    # (the brokers only: this process and the producer stay uninstrumented)
    with environment(PYTHONPATH=path, ROUND_TRIP_STEPS=json.dumps(STEPS),
                     ROUND_TRIP_STEPS_OUT=str(out)):
        return Run(workdir)


def instrumented_round(run: Run, out: Path, records: int
                       ) -> tuple[dict[int, float], dict[int, dict[str, list[int]]]]:
    """(CPU µs per record per broker, {broker: {step: [calls, ns]}}) over ``records``."""
    for f in out.glob("*.json"):
        f.unlink()
    for pid in run.pids.values():
        os.kill(pid, signal.SIGUSR1)
    time.sleep(0.2)
    cpu = run.measure(records)
    for pid in run.pids.values():
        os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + 10
    while len(list(out.glob("*.json"))) < len(run.pids):
        if time.monotonic() > deadline:
            raise RuntimeError("the brokers did not write their step counters")
        time.sleep(0.1)
    time.sleep(0.2)  # (the last file may still be being written)
    return cpu, {b: json.loads((out / f"{pid}.json").read_text())
                 for b, pid in run.pids.items()}


def steps_table(rounds: list[dict[str, list[int]]], records: int) -> str:
    """Median over ``rounds`` (one broker's counters each) per step, largest first."""
    rows = []
    for label in {label for r in rounds for label in r}:
        calls = statistics.median(r.get(label, [0, 0])[0] for r in rounds) / records
        us = statistics.median(r.get(label, [0, 0])[1] for r in rounds) / 1000 / records
        rows.append((us, calls, label))
    lines = ["| step | µs per record | calls per record | µs per call |",
             "|---|---:|---:|---:|"]
    lines += [f"| {label} | {us:,.1f} | {calls:.2f} | {us / calls if calls else 0:,.1f} |"
              for us, calls, label in sorted(rows, reverse=True)]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--records", type=int, default=3000, help="timed records per round")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds, each a plain then an instrumented measurement (medians)")
    ap.add_argument("--dir", default=str(ROOT / "bench-data" / "round-trip-steps"),
                    help="the clusters' directory (wiped first)")
    args = ap.parse_args()
    if args.records < 1 or args.rounds < 1:
        ap.error("--records and --rounds must be >= 1")
    workdir = Path(args.dir).resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    site = Path(tempfile.mkdtemp(prefix="round-trip-steps-"))
    out = site / "out"
    out.mkdir()
    print(f"machine: {machine_description(str(ROOT))}", flush=True)
    runs: list[Run] = []
    cpu: dict[str, list[list[tuple[str, float]]]] = {"plain": [], "instrumented": []}
    leader_steps: list[dict[str, list[int]]] = []
    follower_steps: list[dict[str, list[int]]] = []
    loads: list[float] = []
    try:
        plain = Run(workdir / "plain")
        runs.append(plain)
        instrumented = start_instrumented(workdir / "instrumented", site, out)
        runs.append(instrumented)
        for run in runs:
            run.send(WARMUP_RECORDS)
        for n in range(args.rounds):
            cpu["plain"].append(by_role(plain.leader, plain.measure(args.records)))
            used, steps = instrumented_round(instrumented, out, args.records)
            cpu["instrumented"].append(by_role(instrumented.leader, used))
            leader_steps.append(steps[instrumented.leader])
            follower_steps += [s for b, s in steps.items() if b != instrumented.leader]
            loads.append(os.getloadavg()[0])
            print(f"  round {n + 1}: plain " + ", ".join(
                f"{role} {us:,.0f}" for role, us in cpu["plain"][-1]) + "; instrumented "
                + ", ".join(f"{role} {us:,.0f}" for role, us in cpu["instrumented"][-1])
                + f" µs per record (load {loads[-1]:.1f})", flush=True)
    finally:
        for run in runs:
            run.down()
        shutil.rmtree(site, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)

    print("\nCPU per record, µs, medians of the rounds (per round in brackets):\n")
    print("| broker | plain | instrumented |\n|---|---:|---:|")
    roles = [role for role, _ in cpu["plain"][0]]
    for i, role in enumerate(roles):
        cells = []
        for kind in ("plain", "instrumented"):
            per = [r[i][1] for r in cpu[kind]]
            cells.append(f"{statistics.median(per):,.0f} ({', '.join(f'{x:,.0f}' for x in per)})")
        print(f"| {role} | {cells[0]} | {cells[1]} |")
    print(f"\nSteps at the leader, per record (inclusive; medians of {args.rounds} rounds):\n")
    print(steps_table(leader_steps, args.records))
    print(f"\nSteps at a follower, per record (inclusive; medians over both followers' "
          f"{len(follower_steps)} rounds):\n")
    print(steps_table(follower_steps, args.records))
    print(f"\nLoad per round: {', '.join(f'{x:.1f}' for x in loads)}; at the end: "
          f"{load_average()}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
