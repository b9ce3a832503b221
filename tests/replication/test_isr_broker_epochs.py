"""Broker epochs in ISR changes (KIP-841/903): what the leader sends with a proposed ISR, which
follower fetches make a replica eligible, and the ISR writer's rule over the registrations."""

from __future__ import annotations

from dataclasses import replace

from replication_helpers import TP, records, state

from tidelog.replication import Partition, ReplicationConfig
from tidelog.replication.isr_eligibility import IneligibleReplica, ineligible_replicas_for_isr
from tidelog.replication.replica_manager import ReplicaManager
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager


def _leading(eligible: dict[int, int] | None = None, own_epoch: int = 500) -> ReplicaManager:
    """Broker 1 leads TP (replicas 1, 2, 3; ISR 1, 2) with broker epoch ``own_epoch``."""
    rm = ReplicaManager(1, LogManager(["/data"], LogConfig(), MemoryFileIO()),
                        ReplicationConfig(), broker_epoch=own_epoch)
    rm.set_eligible_brokers(eligible)
    rm.become_leader_or_follower(0, 1, [replace(state(1, 0, (1, 2)), is_new=True)], (1,), 0)
    rm.partitions[TP].append_records_to_leader(records(2), acks=1, now_ms=0)
    return rm


def _leader(eligible: dict[int, int] | None = None, own_epoch: int = 500) -> Partition:
    return _leading(eligible, own_epoch).partitions[TP]


def test_a_proposal_carries_each_member_s_broker_epoch_as_the_leader_knows_it() -> None:
    p = _leader()
    p.update_follower_fetch_state(2, 2, 0, 1, 2, broker_epoch=700)
    proposal = p.update_follower_fetch_state(3, 2, 0, 1, 2, broker_epoch=900)
    assert proposal is not None and proposal.new_isr == (1, 2, 3)
    # Its own epoch, each follower's from its last fetch.
    assert proposal.isr_with_broker_epochs == ((1, 500), (2, 700), (3, 900))


def test_a_member_whose_fetch_carried_no_epoch_goes_with_minus_one() -> None:
    p = _leader()
    proposal = p.update_follower_fetch_state(3, 2, 0, 1, 2)  # Fetch <= v14: no ReplicaState
    assert proposal is not None
    # Follower 2 has not fetched since this broker became leader: its epoch is unknown.
    assert proposal.isr_with_broker_epochs == ((1, 500), (2, -1), (3, -1))


def test_a_fetch_from_an_earlier_registration_does_not_expand_the_isr() -> None:
    p = _leader(eligible={1: 500, 2: 700, 3: 901})  # 3 registered again: epoch 901
    assert p.update_follower_fetch_state(3, 2, 0, 1, 2, broker_epoch=900) is None
    assert p.pending_isr is None and p.isr == {1, 2}
    proposal = p.update_follower_fetch_state(3, 2, 0, 2, 2, broker_epoch=901)
    assert proposal is not None and proposal.new_isr == (1, 2, 3)


def test_an_unknown_registration_epoch_checks_liveness_only() -> None:
    # -1: the driver could not read the registrations; a live broker is eligible.
    p = _leader(eligible={1: -1, 2: -1, 3: -1})
    assert p.update_follower_fetch_state(3, 2, 0, 1, 2, broker_epoch=900) is not None
    dead = _leader(eligible={1: -1, 2: -1})
    assert dead.update_follower_fetch_state(3, 2, 0, 1, 2, broker_epoch=900) is None


def test_the_isr_writer_refuses_unregistered_members_and_stale_epochs() -> None:
    registered = {1: 500, 2: 700, 3: 901}.get
    assert ineligible_replicas_for_isr(((1, 500), (2, 700), (3, 901)), registered) == []
    assert ineligible_replicas_for_isr(((1, 500), (3, 900)), registered) == [
        IneligibleReplica(3, "stale broker epoch")]
    assert ineligible_replicas_for_isr(((1, 500), (4, -1)), registered) == [
        IneligibleReplica(4, "not registered")]
    # -1: the leader did not know the epoch; only the registration is checked.
    assert ineligible_replicas_for_isr(((1, -1), (2, -1)), registered) == []


def test_a_fetch_from_a_registration_newer_than_the_metadata_counts() -> None:
    # 3 re-registered (epoch 905) after the last UpdateMetadata (901): its current process.
    p = _leader(eligible={1: 500, 2: 700, 3: 901})
    assert p.update_follower_fetch_state(3, 2, 0, 1, 2, broker_epoch=905) is not None

