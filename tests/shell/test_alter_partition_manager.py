"""The broker side of AlterPartition (KIP-497), written once for both drivers: the shell's
AlterPartitionManager over a transport the test answers by hand (the boundary: what the wire or
the simulated network would carry)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tidelog.protocol.errors import ErrorCode
from tidelog.replication.types import ProposeIsr, TopicPartition
from tidelog.shell.alter_partition_manager import (
    RETRY_BACKOFF_MS,
    AlterPartitionAnswer,
    AlterPartitionManager,
    PartitionAnswer,
)

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


class Transport:
    """Keeps each request; the test answers it."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, list[ProposeIsr],
                              Callable[[AlterPartitionAnswer | None], None]]] = []

    def send(self, broker_epoch: int, items: Sequence[ProposeIsr],
             on_done: Callable[[AlterPartitionAnswer | None], None]) -> None:
        self.sent.append((broker_epoch, list(items), on_done))

    def answer(self, answer: AlterPartitionAnswer | None, index: int = -1) -> None:
        self.sent[index][2](answer)


class Clock:
    def __init__(self) -> None:
        self.now = 0
        self.timers: list[tuple[int, Callable[[], Any]]] = []

    def milliseconds(self) -> int:
        return self.now

    def schedule(self, name: str, fn: Callable[[], Any], delay_ms: int,
                 period_ms: int = -1) -> Any:
        self.timers.append((self.now + delay_ms, fn))
        return None

    def advance(self, ms: int) -> None:
        self.now += ms
        due = [t for t in self.timers if t[0] <= self.now]
        self.timers = [t for t in self.timers if t[0] > self.now]
        for _, fn in due:
            fn()


def proposal(tp: TopicPartition, isr: tuple[int, ...] = (1, 2), leader_epoch: int = 3,
             zk_version: int = 7) -> ProposeIsr:
    return ProposeIsr(tp, 1, leader_epoch, isr, zk_version, 1,
                      tuple((b, 100 + b) for b in isr))


class Setup:
    def __init__(self) -> None:
        self.transport = Transport()
        self.clock = Clock()
        self.epoch = 42
        self.manager = AlterPartitionManager(1, self.transport, self.clock, lambda: self.epoch)
        self.results: list[tuple[TopicPartition, bool, int]] = []

    def submit(self, prop: ProposeIsr) -> None:
        self.manager.submit(prop, lambda ok, v: self.results.append((prop.tp, ok, v)))


def ok(prop: ProposeIsr, version: int = 8) -> PartitionAnswer:
    return PartitionAnswer(0, prop.leader, prop.leader_epoch, prop.new_isr, version)


def test_one_request_in_flight_and_what_comes_meanwhile_goes_together_in_the_next() -> None:
    s = Setup()
    a, b = proposal(A), proposal(B, (1,))
    s.submit(a)
    assert len(s.transport.sent) == 1 and s.transport.sent[0][:2] == (42, [a])
    s.submit(b)
    s.submit(proposal(TopicPartition("t", 2)))
    assert len(s.transport.sent) == 1  # one in flight
    s.transport.answer(AlterPartitionAnswer(0, {A: ok(a)}))
    assert s.results == [(A, True, 8)]
    # the answer sends the two waiting at once, in one request
    assert len(s.transport.sent) == 2
    assert [p.tp for p in s.transport.sent[1][1]] == [B, TopicPartition("t", 2)]


def test_a_second_proposal_for_a_partition_still_waiting_is_not_attempted() -> None:
    s = Setup()
    s.submit(proposal(A))
    s.submit(proposal(A, (1,)))
    assert s.results == [(A, False, -1)]  # OPERATION_NOT_ATTEMPTED: back to the committed ISR
    assert len(s.transport.sent) == 1


@pytest.mark.parametrize("answer", [None, AlterPartitionAnswer(int(ErrorCode.STALE_BROKER_EPOCH))],
                         ids=["no answer (NOT_CONTROLLER, network)", "STALE_BROKER_EPOCH"])
def test_a_failed_request_is_sent_again_after_the_backoff_with_the_epoch_as_it_is_then(
        answer: AlterPartitionAnswer | None) -> None:
    s = Setup()
    a = proposal(A)
    s.submit(a)
    s.transport.answer(answer)
    assert s.results == [] and len(s.transport.sent) == 1
    s.epoch = 43  # registered again meanwhile
    s.clock.advance(RETRY_BACKOFF_MS - 1)
    assert len(s.transport.sent) == 1
    s.clock.advance(1)
    assert len(s.transport.sent) == 2 and s.transport.sent[1][:2] == (43, [a])
    s.transport.answer(AlterPartitionAnswer(0, {A: ok(a)}))
    assert s.results == [(A, True, 8)] and s.manager.retries == 1


def test_a_partition_left_out_of_the_answer_is_sent_again() -> None:
    s = Setup()
    a, b = proposal(A), proposal(B)
    s.submit(a)
    s.submit(b)
    s.transport.answer(AlterPartitionAnswer(0, {A: ok(a)}))
    s.transport.answer(AlterPartitionAnswer(0, {A: ok(a), B: ok(b)}))  # (b's first request)
    assert [p.tp for p in s.transport.sent[-1][1]] == [B]


@pytest.mark.parametrize("error", [ErrorCode.INELIGIBLE_REPLICA, ErrorCode.OPERATION_NOT_ATTEMPTED])
def test_a_refusal_sends_the_leader_back_to_its_committed_isr(error: ErrorCode) -> None:
    s = Setup()
    s.submit(proposal(A))
    s.transport.answer(AlterPartitionAnswer(0, {A: PartitionAnswer(int(error))}))
    assert s.results == [(A, False, -1)] and s.manager.answered == {int(error): 1}


@pytest.mark.parametrize("error", [
    ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.INVALID_UPDATE_VERSION,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_TOPIC_ID, ErrorCode.INVALID_REQUEST,
    ErrorCode.NEW_LEADER_ELECTED])
def test_a_stale_leader_keeps_its_proposal_pending_for_the_controllers_leader_and_isr(
        error: ErrorCode) -> None:
    s = Setup()
    s.submit(proposal(A))
    s.transport.answer(AlterPartitionAnswer(0, {A: PartitionAnswer(int(error))}))
    s.clock.advance(10 * RETRY_BACKOFF_MS)
    assert s.results == [] and len(s.transport.sent) == 1
    # the partition no longer waits here: a new proposal (after a LeaderAndIsr) is sent
    s.submit(proposal(A, leader_epoch=4))
    assert len(s.transport.sent) == 2


@pytest.mark.parametrize("error", [ErrorCode.NOT_CONTROLLER, ErrorCode.UNKNOWN_SERVER_ERROR])
def test_any_other_error_submits_the_proposal_again(error: ErrorCode) -> None:
    s = Setup()
    a = proposal(A)
    s.submit(a)
    s.transport.answer(AlterPartitionAnswer(0, {A: PartitionAnswer(int(error))}))
    assert s.results == [] and len(s.transport.sent) == 2 and s.transport.sent[1][1] == [a]
    s.transport.answer(AlterPartitionAnswer(0, {A: ok(a, 9)}))
    assert s.results == [(A, True, 9)]


def test_an_answer_for_another_state_is_no_answer_to_this_proposal() -> None:
    s = Setup()
    a = proposal(A)
    s.submit(a)
    other = PartitionAnswer(0, 1, a.leader_epoch + 1, (1,), 9)
    s.transport.answer(AlterPartitionAnswer(0, {A: other}))
    assert s.results == []  # pending until the LeaderAndIsr that made that state


def test_after_shutdown_nothing_is_sent_or_answered() -> None:
    s = Setup()
    s.submit(proposal(A))
    s.submit(proposal(B))
    s.manager.shutdown()
    s.transport.answer(AlterPartitionAnswer(0, {A: ok(proposal(A))}))
    assert s.results == [] and len(s.transport.sent) == 1
