"""The broker's side of a log dir failing at runtime (Kafka's JBOD handling in ZooKeeper mode).

Once the shell took the failed dir's partitions offline it asks the driver for two things:
tell the controller (`KafkaZkClient.propagate_log_dir_event`: a sequential
`/log_dir_event_notification/log_dir_event_<seq>` holding `{"version":1,"broker":id,"event":1}`;
the controller answers with LeaderAndIsr for every replica of this broker and moves leaderships
off those answered KAFKA_STORAGE_ERROR), or, with no log dir left, halt the process as Kafka's
LogManager does (`Exit.halt(1)`; tests replace the procedure with `set_halt_procedure`, as
Kafka's `Exit.setHaltProcedure`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

__all__ = ["ZkLogDirFailureHandling", "halt", "set_halt_procedure"]

logger = logging.getLogger(__name__)

_halt_procedure: Callable[[int], Any] = os._exit


def set_halt_procedure(procedure: Callable[[int], Any] | None) -> None:
    """Replace what `halt` does (None: back to ending the process)."""
    global _halt_procedure
    _halt_procedure = procedure if procedure is not None else os._exit


def halt(status: int) -> None:
    """End the process at once, without shutdown hooks (Kafka's Exit.halt)."""
    _halt_procedure(status)


class ZkLogDirFailureHandling:
    """`shell.interfaces.LogDirFailureHandling` over ZooKeeper."""

    def __init__(self, broker_id: int, zk_client: Any | None) -> None:
        self.broker_id = broker_id
        self.zk_client = zk_client
        self.events_written = 0
        self._background: set[asyncio.Task[None]] = set()

    def propagate_log_dir_event(self) -> None:
        task = asyncio.get_running_loop().create_task(self._propagate())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _propagate(self) -> None:
        if self.zk_client is None:
            return
        try:
            name = await asyncio.to_thread(self.zk_client.propagate_log_dir_event,
                                           self.broker_id)
        except Exception as e:  # noqa: BLE001 - the session may be gone; logged, as Kafka
            logger.error("broker %d: writing the log dir event notification failed: %s",
                         self.broker_id, e)
            return
        self.events_written += 1
        logger.warning("broker %d: log dir failure notified (%s)", self.broker_id, name)

    def halt(self, reason: str) -> None:
        logger.critical("Shutdown broker because %s", reason)
        halt(1)

    async def shutdown(self) -> None:
        if self._background:
            await asyncio.wait(list(self._background), timeout=5)
