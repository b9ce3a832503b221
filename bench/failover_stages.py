"""Where bench/scale.py's kill -9 failover time goes, stage by stage (issue 12 item 6).

One 3-broker cluster (tidelog or Apache Kafka 3.9, bench/scale.py's configs: session timeout
6000 ms, ZooKeeper tickTime 500 ms), a topic of --partitions at RF=3; then per cycle the
preferred leaders elected, a non-controller broker killed with SIGKILL and, from the kill:
(a) the ZooKeeper session expired (the server's log) and /brokers/ids/<victim> gone (a watch
of a separate kazoo client); (b) the controller's broker change (its log); (c) the partition
state znodes written (their mtimes); (d) the controller broker's Metadata showing every
partition led (what scale.py times). Before the kill: each broker's negotiated session timeout
and packets per second while idle (`cons`), and how long before the kill the victim's session
last spoke to ZooKeeper, and what (`cons`' lresp and lop against this client's own after a
sync). Prints one JSON line per cycle and writes them all to --out.

    python bench/failover_stages.py --target tidelog --cycles 4 --out stages.json
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import scale
from kazoo.client import KazooClient

from tidelog.cluster.zookeeper import four_letter_word

TS = re.compile(r"^\[?(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]\d{3})")


def parse_ts(line: str) -> float | None:
    m = TS.match(line)
    if not m:
        return None
    return datetime.strptime(m.group(1).replace("T", " ").replace(".", ","), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def first_line_after(path: Path, t0: float, pattern: str) -> tuple[float, str] | None:
    rx = re.compile(pattern)
    for line in path.read_text(errors="replace").splitlines():
        t = parse_ts(line)
        if t is not None and t >= t0 - 0.002 and rx.search(line):
            return t, line.strip()[:200]
    return None


def cons(host: str, port: int) -> list[dict[str, str]]:
    out = []
    for line in four_letter_word(host, port, "cons").splitlines():
        m = re.search(r"\((.*)\)", line)
        if not m:
            continue
        out.append(dict(kv.split("=", 1) for kv in m.group(1).split(",") if "=" in kv))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", choices=["tidelog", "kafka"], required=True)
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--keep-logs", type=Path, help="copy the brokers' and ZooKeeper's logs here")
    ap.add_argument("--settle", type=float, default=0.0, help="seconds between the preferred "
                    "election and the kill (scale.py: none)")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix=f"h8-{args.target}-"))
    target: scale.Target | None = None
    results: dict = {"target": args.target, "cycles": [], "load": []}
    try:
        target = scale.Tidelog(workdir, "tidelog") if args.target == "tidelog" else scale.Kafka(workdir)
        host, port = target.zookeeper.rsplit(":", 1)
        zkport = int(port)
        if args.target == "tidelog":
            zk_log = workdir / "zookeeper" / "zookeeper.log"
        else:
            zk_log = target.cluster.zookeeper.log_path
        kz = KazooClient(hosts=target.zookeeper, timeout=6.0)
        kz.start(timeout=10)
        controller = json.loads(kz.get("/controller")[0])["brokerid"]
        observer = target.address(controller)
        log_of = {b: Path(target.cluster.brokers[b].log_file) for b in target.broker_ids()}
        admin = scale.AdminClient({"bootstrap.servers": target.bootstrap_servers, "log_level": 0})
        print("create", scale.create(admin, observer, args.partitions, 300), flush=True)
        print("full isr", scale.wait_metadata(observer, scale.full_isr(args.partitions), 300), flush=True)
        time.sleep(5)
        # sessions: negotiated timeout and packets received per second while idle
        owners = {b: kz.exists(f"/brokers/ids/{b}").ephemeralOwner for b in target.broker_ids()}
        c1 = {int(c["sid"], 16): c for c in cons(host, zkport) if "sid" in c}
        time.sleep(10)
        c2 = {int(c["sid"], 16): c for c in cons(host, zkport) if "sid" in c}
        sessions = {}
        for b, sid in owners.items():
            sessions[b] = {"sid": hex(sid), "to": c2[sid].get("to"),
                           "recved_per_s": (int(c2[sid]["recved"]) - int(c1[sid]["recved"])) / 10,
                           "sent_per_s": (int(c2[sid]["sent"]) - int(c1[sid]["sent"])) / 10}
        results["sessions"] = sessions
        print("sessions", sessions, flush=True)
        victims = [b for b in target.broker_ids() if b != controller]
        # one watch for all cycles: when the current victim's registration is gone
        watching: dict[str, int] = {"victim": -1}
        gone = threading.Event()
        gone_at: list[float] = []

        def watch(children: list[str]) -> None:
            if str(watching["victim"]) not in children and not gone.is_set():
                gone_at.append(time.time())
                gone.set()

        for n in range(args.cycles):
            victim = victims[n % len(victims)]
            scale.elect_preferred(target, observer, args.partitions, 300)
            time.sleep(args.settle)
            results["load"].append(scale.load_average())
            led = scale.led_by(observer, victim)
            sid = kz.exists(f"/brokers/ids/{victim}").ephemeralOwner
            gone_at.clear()
            gone.clear()
            watching["victim"] = victim
            if n == 0:
                kz.ChildrenWatch("/brokers/ids", watch)
            kz.sync("/")  # our own session's lresp: the server's "now" in cons' clock
            before = {int(c["sid"], 16): c for c in cons(host, zkport) if "sid" in c}
            mine = before[kz.client_id[0]]
            wall0 = time.time()
            t0 = time.monotonic()
            target.signal(victim, signal.SIGKILL)
            d = scale.wait_metadata(observer, lambda ps, v=victim: len(ps) == args.partitions and all(
                leader >= 0 and leader != v for leader, _, _ in ps.values()), 120, t0)
            gone.wait(30)
            scale.wait_exit(target, victim, time.monotonic(), 30)
            a = gone_at[0] - wall0 if gone_at else None
            lresp = (int(before[sid]["lresp"]) - int(mine["lresp"])) / 1000 if sid in before else None
            lop = before[sid].get("lop") if sid in before else None
            # leaders written: the state znodes whose mtime is after the kill
            mtimes = []
            for p in range(args.partitions):
                _, st = kz.get(f"/brokers/topics/{scale.TOPIC}/partitions/{p}/state")
                if st.mtime / 1000 >= wall0:
                    mtimes.append(st.mtime / 1000 - wall0)
            time.sleep(1)
            if args.target == "tidelog":
                b = first_line_after(log_of[controller], wall0, r"brokers joined .* left \(\d")
            else:
                b = first_line_after(log_of[controller], wall0,
                                     r"Newly added brokers: .*deleted brokers: \d")
            expiry = first_line_after(zk_log, wall0, r"Expiring session") if zk_log.exists() else None
            cyc = {"victim": victim, "leaderships": led, "a_znode_deleted": a,
                   "victim_last_response_before_kill": lresp, "victim_last_op": lop,
                   "zk_log_expiry": (expiry[0] - wall0, expiry[1]) if expiry else None,
                   "b_broker_change": (b[0] - wall0, b[1]) if b else None,
                   "c_first_state_write": min(mtimes) if mtimes else None,
                   "c_last_state_write": max(mtimes) if mtimes else None,
                   "c_states_written": len(mtimes),
                   "d_metadata_all_led": d}
            results["cycles"].append(cyc)
            print(json.dumps(cyc), flush=True)
            with scale.zookeeper(target.zookeeper) as zk:
                reg, isr = scale.restart(target, zk, observer, victim, args.partitions, 300,
                                         scale.Profiler(None, target, args.partitions), "unclean")
            print("restart", reg, isr, flush=True)
        kz.stop()
        kz.close()
    finally:
        args.out.write_text(json.dumps(results, indent=1))
        if target is not None:
            target.down()
        if args.keep_logs is not None:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for f in [*workdir.rglob("server.log"), *workdir.rglob("zookeeper.log")]:
                shutil.copy(f, args.keep_logs / f"{f.parent.name}-{f.name}")
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
