"""The faulty network: FIFO links by default, seeded drop/duplicate/reorder, partitions, and
messages from or to an earlier incarnation of a node are lost."""

from __future__ import annotations

import random

from tidelog.sim.clock import Scheduler
from tidelog.sim.network import LinkConfig, Network


def make(seed: int = 1, **link: float | int) -> tuple[Scheduler, Network, dict[int, list]]:
    s = Scheduler()
    net = Network(s, random.Random(seed), LinkConfig(**link))  # type: ignore[arg-type]
    inbox: dict[int, list] = {1: [], 2: []}
    for n in inbox:
        net.register(n, lambda src, msg, n=n: inbox[n].append((src, msg)))
    return s, net, inbox


def test_a_link_delivers_in_order_with_delay():
    s, net, inbox = make(min_delay_ms=1, max_delay_ms=20)
    for i in range(50):
        net.send(1, 2, i)
    s.run_until(1000)
    assert [m for _, m in inbox[2]] == list(range(50))


def test_drop_duplicate_reorder_are_seeded_and_reproducible():
    def run(seed: int) -> list:
        s, net, inbox = make(seed, drop=0.2, duplicate=0.2, reorder=0.3, max_delay_ms=5)
        for i in range(200):
            net.send(1, 2, i)
        s.run_until(10_000)
        return [m for _, m in inbox[2]]

    a, b, c = run(7), run(7), run(8)
    assert a == b and a != c
    assert len(set(a)) < 200  # some dropped
    assert len(a) != len(set(a))  # some duplicated
    assert a != sorted(a)  # some reordered


def test_partition_blocks_both_ways_and_loses_messages_in_flight():
    s, net, inbox = make(min_delay_ms=10, max_delay_ms=10)
    net.send(1, 2, "in flight")
    net.partition({1}, {2})
    net.send(2, 1, "blocked")
    s.run_until(100)
    assert inbox == {1: [], 2: []}
    net.heal()
    net.send(1, 2, "after heal")
    s.run_until(200)
    assert inbox[2] == [(1, "after heal")]


def test_a_restarted_node_does_not_get_messages_meant_for_its_previous_life():
    s, net, inbox = make(min_delay_ms=10, max_delay_ms=10)
    net.send(1, 2, "old")
    net.set_up(2, False)
    net.set_up(2, True)
    net.send(1, 2, "new")
    s.run_until(100)
    assert inbox[2] == [(1, "new")]
    assert net.stats.dropped == 1


def test_messages_to_a_down_node_are_dropped():
    s, net, inbox = make()
    net.set_up(2, False)
    net.send(1, 2, "x")
    s.run_until(100)
    assert inbox[2] == [] and net.stats.dropped == 1
