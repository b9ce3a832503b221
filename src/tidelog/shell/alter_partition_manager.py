"""Kafka's DefaultAlterPartitionManager (KIP-497): a leader's ISR changes go to the controller
as AlterPartition, the same for both drivers.

The controller validates each change against its own state, writes it to ZooKeeper and
answers the new partition state (or an error per partition), then sends UpdateMetadata at
once; the leader writes no ZooKeeper node itself and no ISR-change notification.

As Kafka's manager:
- one request in flight; what is submitted meanwhile waits and goes together in the next
  (Kafka's unsentIsrUpdates), one item per partition: a second proposal for a partition that
  still has one waiting is not attempted (OPERATION_NOT_ATTEMPTED);
- an item leaves only when an answer names its partition; a request that failed (network
  error, a controller that moved: the driver's transport finds the new one) or was answered
  with a top-level error (STALE_BROKER_EPOCH before this broker's registration is known, ...)
  is sent again after `RETRY_BACKOFF_MS`, with the broker epoch as it is then;
- each partition's answer goes to its submitter as Kafka's Partition handles it: the new ISR
  and partition epoch (the zk version) on success; INELIGIBLE_REPLICA and
  OPERATION_NOT_ATTEMPTED reset the leader to its committed ISR; FENCED_LEADER_EPOCH,
  INVALID_UPDATE_VERSION, UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID, INVALID_REQUEST and
  NEW_LEADER_ELECTED leave the proposal pending until the controller's LeaderAndIsr replaces
  it; any other error (NOT_CONTROLLER from a controller whose state is behind, ...) submits
  the proposal again.

The driver supplies only the transport (`AlterPartitionTransport`); time is the shell's
`Scheduler`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tidelog.protocol.errors import ErrorCode
from tidelog.replication.types import ProposeIsr, TopicPartition
from tidelog.shell.interfaces import Scheduler

__all__ = ["RETRY_BACKOFF_MS", "AlterPartitionAnswer", "AlterPartitionManager",
           "AlterPartitionTransport", "PartitionAnswer"]

logger = logging.getLogger(__name__)

# Kafka's DefaultAlterPartitionManager: a top-level error retries in 50 ms.
RETRY_BACKOFF_MS = 50

NONE = int(ErrorCode.NONE)
# The controller refused and says the partition's state is as the leader last had it.
_RESET = frozenset({int(ErrorCode.INELIGIBLE_REPLICA), int(ErrorCode.OPERATION_NOT_ATTEMPTED)})
# The leader's view is out of date: the controller's LeaderAndIsr will replace the proposal.
_AWAIT_LEADER_AND_ISR = frozenset({
    int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), int(ErrorCode.UNKNOWN_TOPIC_ID),
    int(ErrorCode.FENCED_LEADER_EPOCH), int(ErrorCode.INVALID_UPDATE_VERSION),
    int(ErrorCode.INVALID_REQUEST), int(ErrorCode.NEW_LEADER_ELECTED)})


@dataclass(frozen=True, slots=True)
class PartitionAnswer:
    """One partition's part of the answer: an error, or the state the controller holds now."""

    error: int
    leader: int = -1
    leader_epoch: int = -1
    isr: tuple[int, ...] = ()
    partition_epoch: int = -1


@dataclass(frozen=True, slots=True)
class AlterPartitionAnswer:
    error: int
    partitions: Mapping[TopicPartition, PartitionAnswer] = field(default_factory=dict)


class AlterPartitionTransport(Protocol):
    """The driver's way to the active controller."""

    def send(self, broker_epoch: int, items: Sequence[ProposeIsr],
             on_done: Callable[[AlterPartitionAnswer | None], None]) -> None:
        """Send one AlterPartition of ``items`` from this broker's registration
        ``broker_epoch``; later ``on_done(answer)``, or ``on_done(None)`` when no answer came
        (no controller known, a network error, a timeout, NOT_CONTROLLER from a broker that
        is no longer the controller)."""
        ...


OnResult = Callable[[bool, int], None]


@dataclass(slots=True)
class _Item:
    proposal: ProposeIsr
    on_result: OnResult


class AlterPartitionManager:
    """The shell's `interfaces.AlterPartitionManager`. ``broker_epoch()``: this broker's
    registration as known now (-1 before it is)."""

    def __init__(self, broker_id: int, transport: AlterPartitionTransport,
                 scheduler: Scheduler, broker_epoch: Callable[[], int]) -> None:
        self.broker_id = broker_id
        self.transport = transport
        self.scheduler = scheduler
        self.broker_epoch = broker_epoch
        self._unsent: dict[TopicPartition, _Item] = {}
        self._in_flight = False
        self._stopped = False
        self.requests_sent = 0
        self.retries = 0
        # what the answers said, for tests and telemetry: error code -> partitions answered
        self.answered: dict[int, int] = {}

    def submit(self, proposal: ProposeIsr, on_result: OnResult) -> None:
        """Send ``proposal`` with the next request; ``on_result(written, new zk version)``
        once answered (not called while the proposal stays pending for a LeaderAndIsr)."""
        if proposal.tp in self._unsent:
            logger.info("%s: ISR change to %s not attempted: one is already waiting",
                        proposal.tp, list(proposal.new_isr))
            on_result(False, -1)
            return
        self._unsent[proposal.tp] = _Item(proposal, on_result)
        self._maybe_send()

    def shutdown(self) -> None:
        """Nothing more is sent or answered (the process stops)."""
        self._stopped = True
        self._unsent.clear()

    def _maybe_send(self) -> None:
        if self._stopped or self._in_flight or not self._unsent:
            return
        self._in_flight = True
        items = list(self._unsent.values())
        self.requests_sent += 1
        self.transport.send(self.broker_epoch(), [i.proposal for i in items],
                            lambda answer: self._on_answer(items, answer))

    def _retry_later(self) -> None:
        self.retries += 1
        self.scheduler.schedule("send-alter-partition", self._maybe_send, RETRY_BACKOFF_MS)

    def _on_answer(self, items: list[_Item], answer: AlterPartitionAnswer | None) -> None:
        self._in_flight = False
        if self._stopped:
            return
        if answer is None or answer.error != NONE:
            if answer is not None:
                logger.warning("broker %d: the controller answered AlterPartition with error "
                               "%d; retrying", self.broker_id, answer.error)
            self._retry_later()
            return
        resubmit: list[_Item] = []
        for item in items:
            tp = item.proposal.tp
            part = answer.partitions.get(tp)
            if part is None:
                # Kafka keeps an item the answer left out: sent again with the next request.
                logger.warning("%s was sent but not included in the AlterPartition answer", tp)
                continue
            if self._unsent.get(tp) is item:
                del self._unsent[tp]
            self.answered[part.error] = self.answered.get(part.error, 0) + 1
            if self._handle(item, part):
                resubmit.append(item)
        for item in resubmit:
            self.submit(item.proposal, item.on_result)
        self._maybe_send()

    def _handle(self, item: _Item, part: PartitionAnswer) -> bool:
        """Kafka's Partition.handleAlterPartitionUpdate / handleAlterPartitionError: True when
        the proposal is to be submitted again."""
        prop = item.proposal
        if part.error == NONE:
            if part.leader_epoch != prop.leader_epoch or tuple(sorted(part.isr)) != prop.new_isr:
                # Not this proposal's outcome (the controller holds another state): the
                # LeaderAndIsr that made it so replaces the proposal.
                logger.info("%s: AlterPartition answered %s at leader epoch %d for a proposal "
                            "of %s at %d; awaiting the controller's LeaderAndIsr", prop.tp,
                            list(part.isr), part.leader_epoch, list(prop.new_isr),
                            prop.leader_epoch)
                return False
            item.on_result(True, part.partition_epoch)
            return False
        if part.error in _RESET:
            logger.info("%s: ISR change to %s refused by the controller (error %d); back to the "
                        "committed ISR", prop.tp, list(prop.new_isr), part.error)
            item.on_result(False, -1)
            return False
        if part.error in _AWAIT_LEADER_AND_ISR:
            logger.info("%s: ISR change to %s refused by the controller (error %d); awaiting its "
                        "LeaderAndIsr", prop.tp, list(prop.new_isr), part.error)
            return False
        logger.warning("%s: ISR change to %s failed with unexpected error %d; retrying",
                       prop.tp, list(prop.new_isr), part.error)
        return True
