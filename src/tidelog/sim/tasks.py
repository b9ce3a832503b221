"""Coroutines on virtual time: the simulator's `TaskRunner` (coordinator/transaction/driver.py).

The transaction coordinator is written once, as coroutines awaiting what its driver gives it.
Here those are `SimFuture`s, completed by the simulated broker's callbacks (an append
acknowledged, a WriteTxnMarkers answer) or by a timer of the process's scheduler; `SimTasks`
steps each coroutine to its next await and resumes it, in an event of its own, when that
future completes. A bare ``yield`` (asyncio's ``sleep(0)``) resumes on the next event of
the same millisecond. A process that dies takes its timers along (the `ProcessScheduler` drops
them), so its coroutines simply never resume.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar

from tidelog.shell.interfaces import Scheduler

__all__ = ["SimFuture", "SimTasks"]

T = TypeVar("T")


class SimFuture:
    """A result that comes later; awaitable from a coroutine run by `SimTasks`."""

    __slots__ = ("_callbacks", "done", "error", "result")

    def __init__(self) -> None:
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None
        self._callbacks: list[Callable[[SimFuture], None]] = []

    def set_result(self, result: Any) -> None:
        if self.done:
            return
        self.done, self.result = True, result
        self._fire()

    def set_exception(self, error: BaseException) -> None:
        if self.done:
            return
        self.done, self.error = True, error
        self._fire()

    def _fire(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)

    def add_done_callback(self, cb: Callable[[SimFuture], None]) -> None:
        if self.done:
            cb(self)
        else:
            self._callbacks.append(cb)

    def __await__(self) -> Generator[Any, None, Any]:
        if not self.done:
            yield self
        if self.error is not None:
            raise self.error
        return self.result


class _Task:
    __slots__ = ("cancelled", "coro")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro
        self.cancelled = False

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.coro.close()


class SimTasks:
    """`TaskRunner` over a process's `Scheduler`. A coroutine that raises is a bug of the
    simulated system: the exception ends the run (the scheduler's event raises)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> _Task:
        task = _Task(coro)
        self._step(task, None, None)
        return task

    def _step(self, task: _Task, value: Any, error: BaseException | None) -> None:
        if task.cancelled:
            return
        try:
            waited = task.coro.send(value) if error is None else task.coro.throw(error)
        except StopIteration:
            return
        if isinstance(waited, SimFuture):
            # Resumed in an event of its own, as asyncio calls a future's callbacks soon: a
            # future completed inside another coroutine (an append completing delayed ones)
            # must not run this one in that coroutine's frame.
            waited.add_done_callback(lambda f: self.scheduler.schedule(
                "task-wakeup", lambda: self._step(task, f.result, f.error), 0))
        elif waited is None:  # a bare yield (asyncio.sleep(0)): the next event
            self.scheduler.schedule("task-yield", lambda: self._step(task, None, None), 0)
        else:
            task.cancel()
            raise TypeError(f"a simulated coroutine awaited {waited!r}")

    def sleep(self, ms: int) -> SimFuture:
        fut = SimFuture()
        self.scheduler.schedule("task-sleep", lambda: fut.set_result(None), ms)
        return fut

    def promise(self) -> SimFuture:
        return SimFuture()

    def gather(self, aws: list[Awaitable[T]]) -> SimFuture:
        out = SimFuture()
        results: list[Any] = [None] * len(aws)
        left = [len(aws)]
        if not aws:
            out.set_result([])
            return out

        async def one(i: int, aw: Awaitable[T]) -> None:
            try:
                results[i] = await aw
            except Exception as e:
                out.set_exception(e)
                return
            left[0] -= 1
            if left[0] == 0:
                out.set_result(results)

        for i, aw in enumerate(aws):
            self.spawn(one(i, aw))
        return out
