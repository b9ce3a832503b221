"""The transaction coordinator in a simulated broker: the one `TransactionCoordinator`
(coordinator/transaction/) on the simulator's side of its driver interfaces.

- `SimTasks` over the process's scheduler runs its coroutines (sim/tasks.py); the process's
  `Time` and `Scheduler` are the shell's (virtual time, gone with the process).
- Appends go through the node's shell `ReplicaManager` (acks=all, as the coordinator's).
- WriteTxnMarkers travel the simulated network (`MarkerRequest`); a partition leader writes
  them with the same `write_markers` the asyncio broker runs.
- Partition leaders come from ZooKeeper's partition states, as the clients read them.

`SimTxnHost.sync` follows the node's leadership of `__transaction_state` partitions after every
LeaderAndIsr / StopReplica (loading a partition from its log on election, as the broker does,
so a new coordinator completes the commits and aborts it finds prepared). The host also serves
the transactional clients' requests (InitProducerId, AddPartitionsToTxn, EndTxn);
read_committed fetches are the node's consumer fetches with isolation level 1.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidelog.coordinator.transaction.coordinator import TransactionCoordinator
from tidelog.coordinator.transaction.log import TRANSACTION_STATE_TOPIC_NAME
from tidelog.coordinator.transaction.marker_channel import write_markers
from tidelog.protocol.messages import write_txn_markers as m_wtm
from tidelog.replication.types import TopicPartition
from tidelog.sim.tasks import SimFuture, SimTasks
from tidelog.storage.transactions import AppendOrigin

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.sim.node import SimBroker

__all__ = ["MarkerRequest", "MarkerResponse", "SimTxnHost", "TxnRequest", "TxnResponse"]


@dataclass(slots=True)
class TxnRequest:
    """A transactional client's request to its coordinator: api "init" (transactional id,
    timeout ms, expected (producer id, epoch) or None), "add" (id, producer id, epoch,
    partitions), "end" (id, producer id, epoch, commit)."""

    corr_id: int
    api: str
    args: tuple[Any, ...]


@dataclass(slots=True)
class TxnResponse:
    corr_id: int
    error: int
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(slots=True)
class MarkerRequest:
    corr_id: int
    request: m_wtm.WriteTxnMarkersRequest


@dataclass(slots=True)
class MarkerResponse:
    corr_id: int
    response: m_wtm.WriteTxnMarkersResponse


class _Appender:
    """`CoordinatorAppender` over the node's shell ReplicaManager (this process's)."""

    __slots__ = ("keys", "rm")

    def __init__(self, rm: Any) -> None:
        self.rm = rm
        self.keys = itertools.count()

    @property
    def core(self) -> Any:
        return self.rm.core

    def append(self, entries: Mapping[TopicPartition, Any], timeout_ms: int) -> SimFuture:
        fut = SimFuture()
        out = self.rm.append_records(-1, entries, timeout_ms, ("txn", next(self.keys)),
                                     lambda done: fut.set_result(dict(done.results)),
                                     AppendOrigin.COORDINATOR)
        if not out.delayed:
            fut.set_result(dict(out.results))
        return fut


class _Leaders:
    """`PartitionLeaders` from ZooKeeper's partition states."""

    __slots__ = ("cluster",)

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    def partition(self, tp: TopicPartition) -> Any:
        return self.cluster.assignments.get(tp)

    def contains_topic(self, topic: str) -> bool:
        return any(tp.topic == topic for tp in self.cluster.assignments)

    def leader_of(self, tp: TopicPartition) -> int | None:
        leader, _ = self.cluster.leader_of(tp)
        return leader if leader >= 0 else None


class SimTxnHost:
    """One broker process's coordinator, marker transport and transactional request handling."""

    def __init__(self, node: SimBroker) -> None:
        self.node = node
        self.cluster = node.cluster
        workload = node.cluster.txn
        assert workload is not None
        self.workload = workload
        proc = node.process
        self.tasks = SimTasks(proc)
        self.appender = _Appender(node.rm)
        self.coordinator = TransactionCoordinator(
            node.broker_id, self.appender, _Leaders(self.cluster), self,
            self.workload.generate_producer_id, self.workload.config, time=proc,
            scheduler=proc, tasks=self.tasks)
        self._corr = itertools.count(1)
        self._inflight: dict[int, tuple[SimFuture, Any]] = {}
        self.coordinator.startup()

    def shutdown(self) -> None:
        self.tasks.spawn(self.coordinator.shutdown())
        for _, timer in self._inflight.values():
            timer.cancel()  # their coroutines are never resumed: the process is gone
        self._inflight.clear()

    # -- leadership --------------------------------------------------------------------------
    def sync(self) -> None:
        core = self.node.core
        if core is None:
            return
        state = self.coordinator.state
        for p in range(self.workload.config.num_partitions):
            part = core.partition(TopicPartition(TRANSACTION_STATE_TOPIC_NAME, p))
            if part is not None and part.is_leader:
                state.on_election(p, part.leader_epoch)
            else:
                state.on_resignation(p)

    # -- MarkerTransport ---------------------------------------------------------------------
    def send(self, broker_id: int, request: m_wtm.WriteTxnMarkersRequest) -> Any:
        if broker_id == self.node.broker_id:
            return self._write_markers(request)
        corr = next(self._corr)
        fut = SimFuture()
        timer = self.node.process.schedule(
            "txn-marker-timeout", lambda: self._timed_out(corr),
            self.workload.config.request_timeout_ms)
        self._inflight[corr] = (fut, timer)
        self.node.network.send(self.node.broker_id, broker_id, MarkerRequest(corr, request))
        return fut

    def _timed_out(self, corr: int) -> None:
        entry = self._inflight.pop(corr, None)
        if entry is not None:
            entry[0].set_exception(TimeoutError("WriteTxnMarkers timed out"))

    async def close(self) -> None:
        return None

    def _write_markers(self, request: m_wtm.WriteTxnMarkersRequest) -> Any:
        return write_markers(self.appender, self.tasks, request,
                             self.workload.config.request_timeout_ms,
                             self.node.process.milliseconds())

    # -- messages ----------------------------------------------------------------------------
    def receive(self, src: int, msg: Any) -> bool:
        """Handle `msg` if it is one of the transactional messages."""
        if isinstance(msg, TxnRequest):
            self.tasks.spawn(self._serve(src, msg))
        elif isinstance(msg, MarkerRequest):
            self.tasks.spawn(self._serve_markers(src, msg))
        elif isinstance(msg, MarkerResponse):
            entry = self._inflight.pop(msg.corr_id, None)
            if entry is not None:
                entry[1].cancel()
                entry[0].set_result(msg.response)
        else:
            return False
        return True

    async def _serve(self, src: int, msg: TxnRequest) -> None:
        c = self.coordinator
        if msg.api == "init":
            txn_id, timeout_ms, expected = msg.args
            r = await c.handle_init_producer_id(txn_id, timeout_ms, expected)
            answer = TxnResponse(msg.corr_id, r.error, r.producer_id, r.producer_epoch)
        elif msg.api == "add":
            txn_id, pid, epoch, tps = msg.args
            answer = TxnResponse(msg.corr_id, await c.handle_add_partitions(txn_id, pid, epoch,
                                                                            tps))
        else:
            txn_id, pid, epoch, commit = msg.args
            answer = TxnResponse(msg.corr_id, await c.handle_end_transaction(txn_id, pid, epoch,
                                                                             commit))
        self.node.network.send(self.node.broker_id, src, answer)

    async def _serve_markers(self, src: int, msg: MarkerRequest) -> None:
        response = await self._write_markers(msg.request)
        self.node.network.send(self.node.broker_id, src, MarkerResponse(msg.corr_id, response))
