"""Virtual time and a heap scheduler: the only clock the simulator knows.

Events are `(time_ms, seq, callback, args)`; ties at the same virtual time are broken by the
sequence number they were scheduled with, so a run depends only on the order of `schedule`
calls — and those depend only on the run's seed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class Timer:
    """A handle on a scheduled event; `cancel()` makes it a no-op when its time comes."""

    __slots__ = ("entry",)

    def __init__(self, entry: list[Any]) -> None:
        self.entry = entry

    def cancel(self) -> None:
        self.entry[2] = None

    @property
    def active(self) -> bool:
        return self.entry[2] is not None

    @property
    def due_ms(self) -> int:
        return self.entry[0]


class Scheduler:
    """Seeded-run event loop over virtual milliseconds."""

    def __init__(self, start_ms: int = 0) -> None:
        self.now_ms: int = start_ms
        self.events_run: int = 0
        self._heap: list[list[Any]] = []
        self._seq: int = 0
        # Called after every event (the simulator checks invariants there).
        self.after_event: Callable[[], None] | None = None

    def schedule(self, delay_ms: int, callback: Callable[..., Any], *args: Any) -> Timer:
        if delay_ms < 0:
            delay_ms = 0
        self._seq += 1
        entry = [self.now_ms + delay_ms, self._seq, callback, args]
        heapq.heappush(self._heap, entry)
        return Timer(entry)

    def call_at(self, time_ms: int, callback: Callable[..., Any], *args: Any) -> Timer:
        return self.schedule(time_ms - self.now_ms, callback, *args)

    def pending(self) -> int:
        return sum(1 for e in self._heap if e[2] is not None)

    def next_time(self) -> int | None:
        heap = self._heap
        while heap and heap[0][2] is None:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def step(self) -> bool:
        """Run one event; False when nothing is left."""
        heap = self._heap
        pop = heapq.heappop
        while heap:
            entry = pop(heap)
            callback = entry[2]
            if callback is None:
                continue
            entry[2] = None  # fired: the Timer is no longer active
            self.now_ms = entry[0]
            self.events_run += 1
            callback(*entry[3])
            if self.after_event is not None:
                self.after_event()
            return True
        return False

    def run_until(self, time_ms: int, max_events: int | None = None) -> int:
        """Run events due at or before `time_ms` (bounded by `max_events`); returns events run."""
        heap = self._heap
        ran = 0
        while heap and (max_events is None or ran < max_events):
            while heap and heap[0][2] is None:
                heapq.heappop(heap)
            if not heap or heap[0][0] > time_ms:
                break
            self.step()
            ran += 1
        if (max_events is None or ran < max_events) and self.now_ms < time_ms:
            self.now_ms = time_ms
        return ran

    def run_for(self, duration_ms: int, max_events: int | None = None) -> int:
        return self.run_until(self.now_ms + duration_ms, max_events)

    def run_events(self, count: int) -> int:
        ran = 0
        while ran < count and self.step():
            ran += 1
        return ran
