"""LogDirFailureChannel: where an I/O error in a log dir is reported (Kafka's class of the name).

Any part of storage that hits an `OSError` in a log dir (a log's append, read, roll or flush, a
checkpoint write) reports the dir here. The first report of a dir queues it; the replica
manager takes queued dirs off (Kafka's LogDirFailureHandler thread) and takes each whole dir
offline: its partitions stop, the controller is told, and the broker halts once no dir is left.
A dir is reported once: later errors in it change nothing (it is offline until the restart).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

__all__ = ["LogDirFailureChannel"]

logger = logging.getLogger(__name__)


class LogDirFailureChannel:
    def __init__(self) -> None:
        self._offline: set[str] = set()
        self._queue: deque[str] = deque()
        # Woken after a dir is queued (the driver schedules the handler; never run inline: the
        # reporter is deep inside an append or a read).
        self.on_offline_log_dir: Callable[[], None] | None = None
        # Told of a newly failed dir at once, before the handler runs (the LogManager marks
        # the dir's logs failed): Kafka's maybeHandleIOException refuses every operation in a
        # dir from its first report on, checking hasOfflineLogDir each time.
        self.offline_listeners: list[Callable[[str], None]] = []

    def maybe_add_offline_log_dir(self, log_dir: str, message: str) -> None:
        """Kafka's maybeAddOfflineLogDir: log, and queue the dir if it is newly failed."""
        logger.error("%s", message)
        if log_dir in self._offline:
            return
        self._offline.add(log_dir)
        for listener in self.offline_listeners:
            listener(log_dir)
        self._queue.append(log_dir)
        if self.on_offline_log_dir is not None:
            self.on_offline_log_dir()

    def has_queued_dirs(self) -> bool:
        return bool(self._queue)

    def take_next_offline_log_dir(self) -> str | None:
        """The next failed dir to handle, None when none is waiting."""
        return self._queue.popleft() if self._queue else None
