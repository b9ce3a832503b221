"""The virtual-time scheduler: order by time, ties by scheduling order, cancellation."""

from __future__ import annotations

from tidelog.sim.clock import Scheduler


def test_events_run_in_time_order_and_ties_in_scheduling_order():
    s = Scheduler()
    seen: list[tuple[int, str]] = []
    s.schedule(10, lambda: seen.append((s.now_ms, "b")))
    s.schedule(5, lambda: seen.append((s.now_ms, "a")))
    s.schedule(10, lambda: seen.append((s.now_ms, "c")))
    s.run_until(100)
    assert seen == [(5, "a"), (10, "b"), (10, "c")]
    assert s.now_ms == 100 and s.events_run == 3


def test_cancelled_timer_never_fires_and_is_not_counted():
    s = Scheduler()
    fired: list[int] = []
    t = s.schedule(5, fired.append, 1)
    s.schedule(6, fired.append, 2)
    t.cancel()
    assert not t.active
    s.run_until(10)
    assert fired == [2] and s.events_run == 1


def test_run_until_stops_at_the_bound_and_leaves_later_events():
    s = Scheduler()
    fired: list[int] = []
    for d in (1, 2, 3, 50):
        s.schedule(d, fired.append, d)
    assert s.run_until(10) == 3
    assert fired == [1, 2, 3] and s.next_time() == 50
    assert s.run_events(10) == 1 and s.now_ms == 50


def test_after_event_hook_runs_after_each_event():
    s = Scheduler()
    calls: list[int] = []
    s.after_event = lambda: calls.append(s.now_ms)
    s.schedule(3, lambda: s.schedule(4, lambda: None))
    s.run_until(20)
    assert calls == [3, 7]


def test_max_events_bounds_a_run_that_would_never_end():
    s = Scheduler()

    def forever() -> None:
        s.schedule(0, forever)

    s.schedule(0, forever)
    assert s.run_until(10, max_events=1000) == 1000


def test_a_fired_timer_is_no_longer_active():
    s = Scheduler()
    t = s.schedule(1, lambda: None)
    assert t.active
    s.run_until(5)
    assert not t.active
