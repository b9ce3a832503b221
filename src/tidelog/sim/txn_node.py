"""The transaction coordinator in a simulated broker: the one `TransactionCoordinator`
(coordinator/transaction/) on the simulator's side of its driver interfaces.

- `SimTasks` over the process's scheduler runs its coroutines (sim/tasks.py); the process's
  `Time` and `Scheduler` are the shell's (virtual time, gone with the process).
- Appends go through the node's shell `ReplicaManager` (acks=all, as the coordinator's).
- WriteTxnMarkers travel the simulated network (`BrokerRequest`); a partition leader writes
  them with the same `write_markers` the asyncio broker runs.
- A transactional produce is verified (KIP-890) by the same `AddPartitionsToTxnManager` the
  asyncio broker runs, its AddPartitionsToTxn v4 on the simulated network (`BrokerRequest`),
  and appended only with the verification guard; with the run's
  `transaction_partition_verification_enable` off it is appended unverified, as the asyncio
  broker's produce handler does with that config off.
- Partition leaders come from ZooKeeper's partition states, as the clients read them.

`SimTxnHost.sync` follows the node's leadership of `__transaction_state` partitions after every
LeaderAndIsr / StopReplica (loading a partition from its log on election, as the broker does,
so a new coordinator completes the commits and aborts it finds prepared). The host also serves
the transactional clients' requests (InitProducerId, AddPartitionsToTxn, EndTxn);
read_committed fetches are the node's consumer fetches with isolation level 1.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidelog.coordinator.transaction.add_partitions_to_txn_manager import (
    AddPartitionsToTxnManager,
    answer_verifications,
)
from tidelog.coordinator.transaction.coordinator import TransactionCoordinator
from tidelog.coordinator.transaction.log import TRANSACTION_STATE_TOPIC_NAME
from tidelog.coordinator.transaction.marker_channel import write_markers
from tidelog.protocol.messages import add_partitions_to_txn as m_apt
from tidelog.protocol.messages import write_txn_markers as m_wtm
from tidelog.replication.types import TopicPartition
from tidelog.sim.messages import ProduceRequest, ProduceResponse
from tidelog.sim.tasks import SimFuture, SimTasks
from tidelog.storage.producer_state_manager import VerificationGuard
from tidelog.storage.transactions import AppendOrigin

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.sim.node import SimBroker

__all__ = ["BrokerRequest", "BrokerResponse", "SimTxnHost", "TxnRequest", "TxnResponse"]


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
class BrokerRequest:
    """A broker's request to another: WriteTxnMarkers (from a coordinator) or AddPartitionsToTxn
    v4 verify_only (from a partition leader)."""

    corr_id: int
    request: m_wtm.WriteTxnMarkersRequest | m_apt.AddPartitionsToTxnRequest


@dataclass(slots=True)
class BrokerResponse:
    corr_id: int
    response: m_wtm.WriteTxnMarkersResponse | m_apt.AddPartitionsToTxnResponse


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
    """One broker process's coordinator, its transport of broker requests (`MarkerTransport`
    and `VerificationTransport`), its partitions' transaction verification and the
    transactional requests' handling."""

    def __init__(self, node: SimBroker) -> None:
        self.node = node
        self.cluster = node.cluster
        workload = node.cluster.txn
        assert workload is not None
        self.workload = workload
        proc = node.process
        self.tasks = SimTasks(proc)
        self.appender = _Appender(node.rm)
        self.leaders = _Leaders(self.cluster)
        self.coordinator = TransactionCoordinator(
            node.broker_id, self.appender, self.leaders, self,
            self.workload.generate_producer_id, self.workload.config, time=proc,
            scheduler=proc, tasks=self.tasks)
        self.verifier = AddPartitionsToTxnManager(
            self.leaders, self.coordinator.state.partition_for, self, self.tasks)
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

    # -- MarkerTransport, VerificationTransport ---------------------------------------------
    def send(self, broker_id: int,
             request: m_wtm.WriteTxnMarkersRequest | m_apt.AddPartitionsToTxnRequest) -> Any:
        if broker_id == self.node.broker_id:
            return self._answer(request)
        corr = next(self._corr)
        fut = SimFuture()
        timer = self.node.process.schedule(
            "txn-broker-request-timeout", lambda: self._timed_out(corr),
            self.workload.config.request_timeout_ms)
        self._inflight[corr] = (fut, timer)
        self.node.network.send(self.node.broker_id, broker_id, BrokerRequest(corr, request))
        return fut

    def _timed_out(self, corr: int) -> None:
        entry = self._inflight.pop(corr, None)
        if entry is not None:
            entry[0].set_exception(TimeoutError("broker request timed out"))

    async def close(self) -> None:
        return None

    def _answer(self, request: m_wtm.WriteTxnMarkersRequest | m_apt.AddPartitionsToTxnRequest
                ) -> Any:
        """This broker's answer, as the asyncio broker's handlers give it."""
        if isinstance(request, m_apt.AddPartitionsToTxnRequest):
            fut = SimFuture()
            fut.set_result(answer_verifications(self.coordinator, self.leaders, request))
            return fut
        return write_markers(self.appender, self.tasks, request,
                             self.workload.config.request_timeout_ms,
                             self.node.process.milliseconds())

    # -- a transactional produce (Kafka's handleProduceAppend before the append) ------------
    def verify_produce(self, src: int, msg: ProduceRequest,
                       append: Callable[[Mapping[TopicPartition, VerificationGuard] | None],
                                        None]) -> None:
        """Verify `msg`'s batch with its coordinator; `append` it with the guards when
        verified, else answer the producer the verification's error. With verification off,
        `append` at once without guards (None: the log checks none)."""
        if not self.cluster.config.transaction_partition_verification_enable:
            append(None)
            return
        self.tasks.spawn(self._verify_produce(src, msg, append))

    async def _verify_produce(self, src: int, msg: ProduceRequest,
                              append: Callable[[Mapping[TopicPartition, VerificationGuard]
                                                | None], None]) -> None:
        assert msg.transactional_id is not None
        failed, guards = await self.verifier.verify_produce(
            self.node.core, msg.transactional_id, {msg.tp: msg.records},
            self.node.process.milliseconds())
        if failed:
            self.node.network.send(self.node.broker_id, src, ProduceResponse(
                msg.corr_id, msg.tp, failed[msg.tp], -1))
        else:
            append(guards)

    # -- messages ----------------------------------------------------------------------------
    def receive(self, src: int, msg: Any) -> bool:
        """Handle `msg` if it is one of the transactional messages."""
        if isinstance(msg, TxnRequest):
            self.tasks.spawn(self._serve(src, msg))
        elif isinstance(msg, BrokerRequest):
            self.tasks.spawn(self._serve_broker(src, msg))
        elif isinstance(msg, BrokerResponse):
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

    async def _serve_broker(self, src: int, msg: BrokerRequest) -> None:
        response = await self._answer(msg.request)
        self.node.network.send(self.node.broker_id, src, BrokerResponse(msg.corr_id, response))
