"""kazoo's threading handler with a cheaper `select`.

kazoo's connection thread calls `handler.select` around every request it writes and every
reply it reads (its main loop, `_write`, `_read`: four or five calls per round trip). The
threading handler's `select` (`kazoo.handlers.utils.selector_select`) builds a new epoll
selector each time: epoll_create, one epoll_ctl per descriptor, epoll_wait, close, and the
`selectors` module's bookkeeping — 14.5 us a call here against 1.7 us for one poll(2), and it
was the largest ZooKeeper cost in the controller's profile. poll(2) has no descriptor limit
either (the reason kazoo left select(2)), so `select` here is one poll call with kazoo's
contract: the ready objects of `rlist` and `wlist` as given (a descriptor readable is reported
readable only, as kazoo's), `xlist` ignored, `timeout` in seconds (None: wait), ValueError for
a closed or invalid descriptor.

It is passed to `KazooClient(handler=...)`, kazoo's documented way to choose a handler; the
rest of the handler is kazoo's own.
"""

from __future__ import annotations

import math
import select
from collections.abc import Sequence
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import fileobj_to_fd

__all__ = ["PollingThreadingHandler", "poll_select"]

_READ = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR
_WRITE = select.POLLOUT | select.POLLHUP | select.POLLERR


def poll_select(rlist: Sequence[Any], wlist: Sequence[Any], xlist: Sequence[Any],
                timeout: float | None = None) -> tuple[list[Any], list[Any], list[Any]]:
    """`kazoo.handlers.utils.selector_select` on one poll(2) call."""
    if timeout is not None:
        if not isinstance(timeout, int | float):
            raise TypeError("timeout must be a number")
        if timeout < 0:
            raise ValueError("timeout must be non-negative")
    wanted: dict[int, int] = {}
    objects: dict[int, list[Any]] = {}
    for mask, fileobjs in ((select.POLLIN | select.POLLPRI, rlist), (select.POLLOUT, wlist)):
        for fileobj in fileobjs:
            fd = fileobj_to_fd(fileobj)
            wanted[fd] = wanted.get(fd, 0) | mask
            objects.setdefault(fd, []).append(fileobj)
    poller = select.poll()
    for fd, mask in wanted.items():
        poller.register(fd, mask)
    # poll takes whole milliseconds: round up, or a short timeout would spin at 0
    ready = poller.poll(None if timeout is None else math.ceil(timeout * 1000))
    readable: list[Any] = []
    writable: list[Any] = []
    for fd, events in ready:
        if events & select.POLLNVAL:
            raise ValueError("Invalid event mask or fd")
        if events & _READ and wanted[fd] & select.POLLIN:
            readable.extend(objects[fd])
        elif events & _WRITE and wanted[fd] & select.POLLOUT:
            writable.extend(objects[fd])
    return readable, writable, []


class PollingThreadingHandler(SequentialThreadingHandler):
    """kazoo's `SequentialThreadingHandler` whose `select` is `poll_select`."""

    def select(self, *args: Any, **kwargs: Any) -> tuple[list[Any], list[Any], list[Any]]:
        return poll_select(*args, **kwargs)
