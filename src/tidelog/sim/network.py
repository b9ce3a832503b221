"""A faulty network between simulated nodes.

Each directed link (src, dst) behaves like a TCP connection by default: messages arrive in order
after a delay. Per-link faults, all decided by the run's `random.Random`: drop, duplicate,
reorder (a message may overtake earlier ones) and extra delay (slow links). Partitions block
links in one or both directions; a message in flight on a link that becomes blocked is lost.

A node that crashes or restarts gets a new incarnation: messages sent to an earlier incarnation
are dropped on arrival (its connections died with it). Messages a node sent before it crashed
still arrive, as bytes already in the receiver's socket buffer are still read: a dead broker's
late fetch is exactly what KIP-841/903 are about.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidelog.sim.clock import Scheduler

Handler = Callable[[int, Any], None]


@dataclass(slots=True)
class LinkConfig:
    min_delay_ms: int = 1
    max_delay_ms: int = 3
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    extra_delay_ms: int = 0  # a slow link: added to every message

    @property
    def faulty(self) -> bool:
        return bool(self.drop or self.duplicate or self.reorder)


@dataclass(slots=True)
class NetworkStats:
    sent: int = 0
    delivered: int = 0
    dropped: int = 0
    duplicated: int = 0
    reordered: int = 0


class Network:
    def __init__(self, scheduler: Scheduler, rng: random.Random,
                 default: LinkConfig | None = None) -> None:
        self.scheduler = scheduler
        self.rng = rng
        self.default = default or LinkConfig()
        self.links: dict[tuple[int, int], LinkConfig] = {}
        self.blocked: set[tuple[int, int]] = set()
        self.handlers: dict[int, Handler] = {}
        self.up: dict[int, bool] = {}
        self.incarnation: dict[int, int] = {}
        self._last_arrival: dict[tuple[int, int], int] = {}
        self.stats = NetworkStats()
        # Scripted interception (scenarios): a rule returning True drops the message.
        self.rules: list[Callable[[int, int, Any], bool]] = []
        # Optional tap: called with (src, dst, msg, fate) for tracing.
        self.tap: Callable[[int, int, Any, str], None] | None = None

    # -- nodes ---------------------------------------------------------------------------
    def register(self, node_id: int, handler: Handler) -> None:
        self.handlers[node_id] = handler
        self.up[node_id] = True
        self.incarnation.setdefault(node_id, 0)

    def set_up(self, node_id: int, up: bool) -> None:
        """Bring a node down or up; both end its current connections."""
        self.up[node_id] = up
        self.incarnation[node_id] = self.incarnation.get(node_id, 0) + 1
        # New connections: no FIFO ordering with what the previous process sent.
        for key in [k for k in self._last_arrival if node_id in k]:
            del self._last_arrival[key]

    # -- faults --------------------------------------------------------------------------
    def link(self, src: int, dst: int) -> LinkConfig:
        cfg = self.links.get((src, dst))
        if cfg is None:
            d = self.default
            cfg = LinkConfig(d.min_delay_ms, d.max_delay_ms, d.drop, d.duplicate, d.reorder,
                             d.extra_delay_ms)
            self.links[(src, dst)] = cfg
        return cfg

    def block(self, src: int, dst: int, both: bool = True) -> None:
        self.blocked.add((src, dst))
        if both:
            self.blocked.add((dst, src))

    def unblock(self, src: int, dst: int, both: bool = True) -> None:
        self.blocked.discard((src, dst))
        if both:
            self.blocked.discard((dst, src))

    def partition(self, side: set[int], others: set[int]) -> None:
        for a in side:
            for b in others:
                if a != b:
                    self.block(a, b)

    def isolate(self, node_id: int) -> None:
        self.partition({node_id}, set(self.handlers) - {node_id})

    def heal(self) -> None:
        """Remove every partition and every per-link fault."""
        self.blocked.clear()
        self.links.clear()

    # -- transport -----------------------------------------------------------------------
    def send(self, src: int, dst: int, msg: Any) -> None:
        self.stats.sent += 1
        key = (src, dst)
        if key in self.blocked or not self.up.get(dst, False):
            self.stats.dropped += 1
            if self.tap is not None:
                self.tap(src, dst, msg, "blocked")
            return
        if self.rules:
            for rule in self.rules:
                if rule(src, dst, msg):
                    self.stats.dropped += 1
                    if self.tap is not None:
                        self.tap(src, dst, msg, "ruled out")
                    return
        cfg = self.links.get(key) or self.default
        rng = self.rng
        if cfg.drop and rng.random() < cfg.drop:
            self.stats.dropped += 1
            if self.tap is not None:
                self.tap(src, dst, msg, "dropped")
            return
        now = self.scheduler.now_ms
        delay = cfg.min_delay_ms
        if cfg.max_delay_ms > cfg.min_delay_ms:
            delay = rng.randint(cfg.min_delay_ms, cfg.max_delay_ms)
        arrival = now + delay + cfg.extra_delay_ms
        if cfg.reorder and rng.random() < cfg.reorder:
            # Let this one overtake (or be overtaken): skip the FIFO clamp.
            self.stats.reordered += 1
            arrival += rng.randint(0, 4 * (cfg.max_delay_ms + 1))
        else:
            last = self._last_arrival.get(key, 0)
            if arrival < last:
                arrival = last
            self._last_arrival[key] = arrival
        inc = self.incarnation[dst]
        self.scheduler.schedule(arrival - now, self._deliver, src, dst, msg, inc)
        if cfg.duplicate and rng.random() < cfg.duplicate:
            self.stats.duplicated += 1
            self.scheduler.schedule(arrival - now + rng.randint(1, 5), self._deliver, src, dst,
                                    msg, inc)

    def _deliver(self, src: int, dst: int, msg: Any, inc: int) -> None:
        if ((src, dst) in self.blocked or not self.up.get(dst, False)
                or inc != self.incarnation[dst]):
            self.stats.dropped += 1
            if self.tap is not None:
                self.tap(src, dst, msg, "lost")
            return
        self.stats.delivered += 1
        self.handlers[dst](src, msg)
