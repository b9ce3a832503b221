"""What a driver supplies to the shell (Kafka's `Time`, `Scheduler`, `AlterPartitionManager`
and `LeaderEndPoint`): a clock, timers, the ISR writer and the transport to a leader."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Protocol

from tidelog.replication.fetcher import FetcherRequest
from tidelog.replication.types import ProposeIsr, TopicPartition

__all__ = ["AlterPartitionManager", "LeaderEndPoint", "LeaderEndPointFactory",
           "LogDirFailureHandling", "ScheduledTask", "Scheduler", "Time"]


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


class AlterPartitionManager(Protocol):
    """The ISR writer. ZooKeeper mode: a compare-and-set on the partition state's zk version,
    and ISR-change notifications for the controller."""

    def submit(self, proposal: ProposeIsr, on_result: Callable[[bool, int], None]) -> None:
        """Write ``proposal``; later ``on_result(written, new zk version or -1)``. Not written
        (as Kafka's INELIGIBLE_REPLICA) when a member is not registered in /brokers/ids or its
        broker epoch in ``proposal.isr_with_broker_epochs`` is not its registration's
        (`replication.isr_eligibility`, KIP-841/903), the check holding at the write (ZooKeeper:
        not written when a broker registered in between); nor on a stale zk version."""
        ...

    def propagate_isr_changes(self, partitions: Collection[TopicPartition],
                              on_result: Callable[[bool], None]) -> None:
        """Tell the controller these partitions' ISRs changed; later ``on_result(written)``."""
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
