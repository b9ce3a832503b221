"""What a driver supplies to the transaction coordinator, besides the shell's `Time` and
`Scheduler` (shell/interfaces.py): coroutines run on its loop, the acks=all appends to the
partitions it leads (``__transaction_state``, and the markers a partition leader writes), the
transport of WriteTxnMarkers to other brokers and the metadata naming partition leaders. A
partition leader's transaction verification (add_partitions_to_txn_manager.py) runs on the same
`TaskRunner` and sends its AddPartitionsToTxn through a `VerificationTransport`.

The coordinator's logic is written once, as coroutines that await only what these interfaces
return. The asyncio broker implements them over its event loop, its replica manager, its
connections and its metadata cache (`asyncio_driver.py`); the simulator over virtual time and
its simulated network (sim/tasks.py, sim/txn_node.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Coroutine, Generator, Mapping
from typing import Any, Protocol, TypeVar

from tidelog.protocol.messages import add_partitions_to_txn as m_apt
from tidelog.protocol.messages import write_txn_markers as m_wtm
from tidelog.replication.types import TopicPartition

__all__ = ["CoordinatorAppender", "MarkerTransport", "PartitionLeaders", "Promise", "TaskHandle",
           "TaskRunner", "VerificationTransport"]

T = TypeVar("T")


class TaskHandle(Protocol):
    def cancel(self) -> None: ...


class Promise(Protocol):
    """A result set later by whoever holds it; a coroutine on the runner's loop awaits it."""

    def set_result(self, result: Any) -> None: ...

    def __await__(self) -> Generator[Any, None, Any]: ...


class TaskRunner(Protocol):
    """Coroutines on the driver's loop (asyncio's tasks, or the simulator's over virtual time)."""

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> TaskHandle:
        """Run ``coro`` in the background; a failure is the runner's to report."""
        ...

    def sleep(self, ms: int) -> Awaitable[None]: ...

    def gather(self, aws: list[Awaitable[T]]) -> Awaitable[list[T]]:
        """The results of every awaitable, in order, once all are done."""
        ...

    def promise(self) -> Promise:
        """A new result to set once (asyncio's future, the simulator's `SimFuture`)."""
        ...


class CoordinatorAppender(Protocol):
    """Appends as the coordinator (acks=all, AppendOrigin.COORDINATOR) to partitions this
    broker leads, and the replication core the loader scans."""

    @property
    def core(self) -> Any: ...

    def append(self, entries: Mapping[TopicPartition, Any], timeout_ms: int
               ) -> Awaitable[Mapping[TopicPartition, Any]]:
        """``{tp: ProducePartitionResult}`` once the ISR has the records, they failed, or after
        ``timeout_ms``."""
        ...


class MarkerTransport(Protocol):
    """WriteTxnMarkers to a partition leader (this broker's own logic when it is the leader)."""

    def send(self, broker_id: int, request: m_wtm.WriteTxnMarkersRequest
             ) -> Awaitable[m_wtm.WriteTxnMarkersResponse]:
        """The answer; raises when the broker cannot be reached or does not answer in time."""
        ...

    async def close(self) -> None: ...


class VerificationTransport(Protocol):
    """AddPartitionsToTxn v4 (verify_only) to a transaction coordinator's broker (this broker's
    own coordinator when it is that broker)."""

    def send(self, broker_id: int, request: m_apt.AddPartitionsToTxnRequest
             ) -> Awaitable[m_apt.AddPartitionsToTxnResponse]:
        """The answer; raises when the broker cannot be reached or does not answer in time."""
        ...

    async def close(self) -> None: ...


class PartitionLeaders(Protocol):
    """The metadata the marker channel reads (the broker's metadata cache)."""

    def partition(self, tp: TopicPartition) -> Any: ...

    def contains_topic(self, topic: str) -> bool: ...

    def leader_of(self, tp: TopicPartition) -> int | None: ...
