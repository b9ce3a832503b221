"""Polling for a condition in tests that drive real processes (an explicit barrier, never a
fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tidelog.client.consumer import Consumer


def wait_until(predicate: Callable[[], Any], timeout_s: float = 15, interval_s: float = 0.05,
               what: str = "condition") -> Any:
    """The predicate's first truthy value; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


async def poll_values(consumer: Consumer, count: int, timeout_s: float = 10) -> list[bytes]:
    """The values of up to ``count`` records a consumer's polls return within ``timeout_s``."""
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(values) < count and time.monotonic() < deadline:
        values += [r.value or b"" for r in await consumer.poll(timeout_ms=200)]
    return values


async def raising_polls(consumer: Consumer, error: type[Exception], times: int, polls: int,
                        timeout_ms: int, count: Callable[[], int]) -> list[tuple[float, int]]:
    """Polls (at most ``polls``, each returning no record) until ``error`` was raised ``times``
    times; for each raise, when the poll that raised began and ``count()`` then. Bounded by
    count, not time: a slow machine only makes the polls span longer."""
    raised: list[tuple[float, int]] = []
    for _ in range(polls):
        started = time.monotonic()
        try:
            assert await consumer.poll(timeout_ms=timeout_ms) == []
        except error:
            raised.append((started, count()))
            if len(raised) == times:
                break
    return raised
