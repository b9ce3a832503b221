"""The broker's log cleaner (Kafka's LogCleaner): log.cleaner.threads cleaning loops on the
event loop. Each loop takes the filthiest compacted log, cleans it in steps of about 1 MiB read
(yielding to the loop between steps, paced to log.cleaner.io.max.bytes.per.second), and waits
log.cleaner.backoff.ms when no log is due."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from tidelog.broker.config import KafkaConfig
from tidelog.broker.replica_manager import now_ms
from tidelog.storage.cleaner.log_cleaner import (
    Cleaner,
    CleanerConfig,
    LogCleanerManager,
    Throttler,
)
from tidelog.storage.log_manager import LogManager

__all__ = ["LogCleaner", "cleaner_config_from"]

logger = logging.getLogger(__name__)


def cleaner_config_from(cfg: KafkaConfig) -> CleanerConfig:
    return CleanerConfig(
        num_threads=cfg.get("log.cleaner.threads"),
        dedupe_buffer_size=cfg.get("log.cleaner.dedupe.buffer.size"),
        dedupe_buffer_load_factor=cfg.get("log.cleaner.io.buffer.load.factor"),
        max_io_bytes_per_second=cfg.get("log.cleaner.io.max.bytes.per.second"),
        backoff_ms=cfg.get("log.cleaner.backoff.ms"),
        enable_cleaner=cfg.get("log.cleaner.enable"),
        producer_id_expiration_ms=cfg.get("producer.id.expiration.ms"),
    )


class LogCleaner:
    def __init__(self, log_manager: LogManager, config: CleanerConfig) -> None:
        self.config = config
        self.manager = LogCleanerManager(log_manager, config)
        # One throttler for all cleaners: the rate bounds their sum, as Kafka's.
        self.throttler = Throttler(config.max_io_bytes_per_second)
        self.passes = 0  # cleaning passes finished (tests and metrics)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        if not self.config.enable_cleaner:
            return
        loop = asyncio.get_running_loop()
        for i, cleaner in enumerate(self.manager.cleaners):
            self._tasks.append(loop.create_task(self._run(cleaner), name=f"kafka-log-cleaner-thread-{i}"))

    async def _run(self, cleaner: Cleaner) -> None:
        backoff_s = self.config.backoff_ms / 1000
        while True:
            steps = None
            try:
                steps = self.manager.clean_once(cleaner, now_ms())
                if steps is None:
                    await asyncio.sleep(backoff_s)
                    continue
                for read in steps:
                    await asyncio.sleep(self.throttler.pause_for(read, time.monotonic()))
                self.passes += 1
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("log cleaner pass failed")
                await asyncio.sleep(backoff_s)
            finally:
                if steps is not None:
                    steps.close()  # a cancelled pass releases its log (done_cleaning)

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        self._tasks.clear()
