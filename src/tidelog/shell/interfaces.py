"""What a driver supplies to the shell (Kafka's `Time`, `Scheduler`, `AlterPartitionManager`
and `LeaderEndPoint`): a clock, timers, where blocking file writes run, the ISR writer and the
transport to a leader."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from tidelog.replication.fetcher import FetcherRequest
from tidelog.replication.types import ProposeIsr

__all__ = ["AlterPartitionManager", "DiskExecutor", "LeaderEndPoint", "LeaderEndPointFactory",
           "LogDirFailureHandling", "RunInline", "ScheduledTask", "Scheduler", "Time"]

T = TypeVar("T")


class Time(Protocol):
    def milliseconds(self) -> int:
        """Now, in ms (wall clock for the broker, virtual time for the simulator)."""
        ...


class ScheduledTask(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    def schedule(self, name: str, fn: Callable[[], Any], delay_ms: int,
                 period_ms: int = -1) -> ScheduledTask:
        """Run ``fn`` after ``delay_ms``, then every ``period_ms`` if that is positive (Kafka's
        `Scheduler.schedule`). A task's exception is the scheduler's to report, never fatal."""
        ...


class DiskExecutor(Protocol):
    """Where the shell's periodic file writes run (the checkpoints: a write, an fsync, a
    rename and a dir fsync per file), off the thread that answers requests, as Kafka runs
    those tasks on its KafkaScheduler threads, not on its request handler threads."""

    def run(self, name: str, work: Callable[[], T], then: Callable[[T | None], None]) -> None:
        """Run ``work`` where it may block, then ``then(its result)`` on the shell's thread.
        ``work`` does file I/O on values taken before: it must not read or change what the
        shell's thread changes. When ``work`` raises, a worker thread reports it and calls
        ``then(None)``; `RunInline` lets it propagate."""
        ...


class RunInline:
    """The `DiskExecutor` of a disk that never blocks (the simulator's memory disk): the work
    and its continuation at once, on the caller's thread (an exception of the work is the
    caller's, as a simulated task's)."""

    def run(self, name: str, work: Callable[[], T], then: Callable[[T | None], None]) -> None:
        then(work())


class AlterPartitionManager(Protocol):
    """The ISR writer: AlterPartition to the controller (KIP-497), which validates and writes
    the change (`shell.alter_partition_manager`, over the driver's transport)."""

    def submit(self, proposal: ProposeIsr, on_result: Callable[[bool, int], None]) -> None:
        """Propose ``proposal``; later ``on_result(True, the new zk version)`` when the
        controller wrote it, ``on_result(False, -1)`` when it refused it and the leader goes
        back to its committed ISR (INELIGIBLE_REPLICA: a member not registered, shutting down
        or registered under another broker epoch than ``proposal.isr_with_broker_epochs``
        says, KIP-841/903). Not called while the proposal awaits the controller's LeaderAndIsr
        (a stale leader epoch or zk version)."""
        ...


class LogDirFailureHandling(Protocol):
    """What follows a log dir failing at runtime, once its partitions went offline (Kafka's
    ReplicaManager.handleLogDirFailure and LogManager.handleLogDirFailure)."""

    def propagate_log_dir_event(self) -> None:
        """Tell the controller (ZooKeeper mode: `/log_dir_event_notification/log_dir_event_<seq>`
        naming this broker); it answers with LeaderAndIsr for every replica of this broker and
        takes those answered KAFKA_STORAGE_ERROR as offline."""
        ...

    def halt(self, reason: str) -> None:
        """No log dir is left: stop the broker process at once (Kafka's Exit.halt(1))."""
        ...


class LeaderEndPoint(Protocol):
    """One fetcher's connection to its leader (Kafka's `LeaderEndPoint`)."""

    def send(self, request: FetcherRequest, on_done: Callable[[Any | None], None]) -> None:
        """Send ``request``; later ``on_done(response in the core's terms)``, or ``on_done(None)``
        when it failed or timed out."""
        ...

    def close(self) -> None: ...


# (source broker, fetcher id) -> the endpoint its fetcher talks through
LeaderEndPointFactory = Callable[[int, int], LeaderEndPoint]
