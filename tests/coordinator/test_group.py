"""The pure consumer group state machine: join / sync / stable, rebalances, session expiry,
leave, stale generations, MEMBER_ID_REQUIRED, the initial rebalance delay."""

from __future__ import annotations

from typing import Any

from tidelog.coordinator.group import (
    NEW_MEMBER_JOIN_TIMEOUT_MS,
    GroupMetadata,
    GroupState,
    JoinResult,
    SyncResult,
)
from tidelog.protocol.errors import ErrorCode as E

SESSION = 10_000
REBALANCE = 30_000
RANGE = [("range", b"sub-range"), ("roundrobin", b"sub-rr")]


def join(g: GroupMetadata, now: int, member_id: str = "", *, new_id: str = "m",
         protocols: list[tuple[str, bytes]] | None = None, require_known: bool = False,
         session: int = SESSION, protocol_type: str = "consumer") -> Any:
    return g.join(member_id=member_id, group_instance_id=None, client_id="c", client_host="/h",
                  session_timeout_ms=session, rebalance_timeout_ms=REBALANCE,
                  protocol_type=protocol_type, protocols=protocols or RANGE,
                  require_known_member_id=require_known, new_member_id=new_id, now_ms=now)


def stable_group(*member_ids: str, delay: int = 100) -> GroupMetadata:
    """A Stable group of these members at generation 1 (sessions counted from time 0)."""
    g = GroupMetadata("g", 0, initial_rebalance_delay_ms=delay)
    for mid in member_ids:
        join(g, 0, new_id=mid)
    d = g.tick(delay)
    if len(member_ids) > 1:  # a second member during the initial delay extends it once
        assert d.joins == {}
        d = g.tick(2 * delay)
    assert g.state == GroupState.COMPLETING_REBALANCE and set(d.joins) == set(member_ids)
    leader = g.leader_id
    assert leader is not None
    d = g.sync(member_id=leader, generation_id=1, protocol_type=None, protocol_name=None,
               assignments={m: f"a-{m}".encode() for m in member_ids}, now_ms=0)
    assert d.store and d.store_generation == 1
    g.on_store_complete(1, 0, 0)
    assert g.state == GroupState.STABLE
    return g


def test_a_single_member_joins_syncs_and_is_stable() -> None:
    g = GroupMetadata("g", 0, initial_rebalance_delay_ms=3000)
    d = join(g, 0, new_id="m1")
    assert d.reply is None and d.waiter == "m1"
    assert g.state == GroupState.PREPARING_REBALANCE
    assert g.tick(2999).joins == {}  # the initial delay is not over
    d = g.tick(3000)
    r = d.joins["m1"]
    assert r.error == 0 and r.generation_id == 1 and r.leader_id == "m1"
    assert r.protocol_name == "range" and r.protocol_type == "consumer"
    assert r.members == (("m1", None, b"sub-range"),)  # the leader gets the subscriptions
    assert g.state == GroupState.COMPLETING_REBALANCE
    d = g.sync(member_id="m1", generation_id=1, protocol_type="consumer", protocol_name="range",
               assignments={"m1": b"all"}, now_ms=3100)
    assert d.reply is None and d.waiter == "m1" and d.store and d.assignment == {"m1": b"all"}
    d = g.on_store_complete(1, 0, 3200)
    assert d.syncs["m1"] == SyncResult(0, b"all", "consumer", "range")
    assert g.state == GroupState.STABLE
    assert g.heartbeat("m1", 1, 4000) == 0
    # A SyncGroup in Stable is answered at once with the member's assignment.
    assert g.sync(member_id="m1", generation_id=1, protocol_type=None, protocol_name=None,
                  assignments={}, now_ms=4100).reply == SyncResult(0, b"all", "consumer", "range")


def test_a_second_member_triggers_a_rebalance_and_both_get_the_next_generation() -> None:
    g = stable_group("m1")
    d = join(g, 1000, new_id="m2")
    assert d.waiter == "m2" and g.state == GroupState.PREPARING_REBALANCE
    # The existing member learns about the rebalance from its heartbeat, then rejoins.
    assert g.heartbeat("m1", 1, 1100) == E.REBALANCE_IN_PROGRESS
    assert g.sync(member_id="m1", generation_id=1, protocol_type=None, protocol_name=None,
                  assignments={}, now_ms=1100).reply.error == E.REBALANCE_IN_PROGRESS
    d = join(g, 1200, "m1")
    # Everyone rejoined: the join phase ends at once, without waiting for the timeout.
    assert set(d.joins) == {"m1", "m2"}
    assert all(r.generation_id == 2 for r in d.joins.values())
    assert d.joins["m1"].leader_id == "m1" and len(d.joins["m1"].members) == 2
    assert d.joins["m2"].members == ()  # followers do not see the subscriptions
    assert g.state == GroupState.COMPLETING_REBALANCE
    # The follower's sync waits for the leader's assignment.
    d = g.sync(member_id="m2", generation_id=2, protocol_type=None, protocol_name=None,
               assignments={}, now_ms=1300)
    assert d.reply is None and d.waiter == "m2" and not d.store
    d = g.sync(member_id="m1", generation_id=2, protocol_type=None, protocol_name=None,
               assignments={"m1": b"p0", "m2": b"p1"}, now_ms=1300)
    assert d.store
    d = g.on_store_complete(2, 0, 1400)
    assert {m: r.assignment for m, r in d.syncs.items()} == {"m1": b"p0", "m2": b"p1"}
    assert g.state == GroupState.STABLE


def test_a_member_that_does_not_rejoin_in_time_is_removed() -> None:
    g = stable_group("m1", "m2")
    join(g, 1000, new_id="m3")
    join(g, 1000, "m1")
    # m2 keeps heartbeating (told to rejoin) but never does: the rebalance timeout removes it.
    for t in range(1000, 1000 + REBALANCE, 5000):
        assert g.heartbeat("m2", 1, t) == E.REBALANCE_IN_PROGRESS
        assert g.tick(t).joins == {}
    assert g.tick(1000 + REBALANCE - 1).joins == {}
    d = g.tick(1000 + REBALANCE)
    assert set(d.joins) == {"m1", "m3"} and not g.has("m2")
    assert g.generation_id == 2


def test_session_timeout_evicts_a_silent_member_and_the_group_rebalances() -> None:
    g = stable_group("m1", "m2")
    assert g.heartbeat("m1", 1, 5000) == 0
    assert g.tick(SESSION + 199).joins == {} and g.has("m2")
    d = g.tick(SESSION + 200)  # m2's session (from the join answered at 200) is over
    assert not g.has("m2") and g.has("m1")
    assert g.state == GroupState.PREPARING_REBALANCE and d.joins == {}
    d = join(g, SESSION + 10, "m1")
    assert d.joins["m1"].generation_id == 2 and d.joins["m1"].error == 0


def test_the_last_member_leaving_empties_the_group_at_the_next_generation() -> None:
    g = stable_group("m1")
    errors, d = g.leave(["m1", "ghost"], 500)
    assert errors == [0, E.UNKNOWN_MEMBER_ID]
    assert g.state == GroupState.EMPTY and g.generation_id == 2
    assert d.store and d.store_generation == 2 and d.assignment == {}  # Kafka writes it


def test_leave_during_a_rebalance_answers_the_leaving_members_join() -> None:
    g = stable_group("m1", "m2")
    join(g, 100, "m1")  # m1 rejoins (leader): a rebalance, m1 waits
    errors, d = g.leave(["m1"], 200)
    assert errors == [0]
    assert d.joins["m1"].error == E.UNKNOWN_MEMBER_ID


def test_stale_generation_and_unknown_member_are_refused() -> None:
    g = stable_group("m1")
    assert g.heartbeat("m1", 0, 100) == E.ILLEGAL_GENERATION
    assert g.heartbeat("nobody", 1, 100) == E.UNKNOWN_MEMBER_ID
    r = g.sync(member_id="m1", generation_id=7, protocol_type=None, protocol_name=None,
               assignments={}, now_ms=100).reply
    assert isinstance(r, SyncResult) and r.error == E.ILLEGAL_GENERATION
    assert g.validate_offset_commit("m1", 0, 100) == E.ILLEGAL_GENERATION
    assert g.validate_offset_commit("nobody", 1, 100) == E.UNKNOWN_MEMBER_ID
    assert g.validate_offset_commit("m1", 1, 100) == 0
    r = join(g, 100, "nobody").reply
    assert isinstance(r, JoinResult) and r.error == E.UNKNOWN_MEMBER_ID
    r = g.sync(member_id="m1", generation_id=1, protocol_type="consumer", protocol_name="other",
               assignments={}, now_ms=100).reply
    assert r.error == E.INCONSISTENT_GROUP_PROTOCOL


def test_member_id_required_then_join_with_the_given_id() -> None:
    g = GroupMetadata("g", 0, initial_rebalance_delay_ms=0)
    d = join(g, 0, require_known=True, new_id="c-123")
    assert d.reply == JoinResult(E.MEMBER_ID_REQUIRED, "c-123") and d.waiter is None
    assert g.state == GroupState.EMPTY and "c-123" in g.pending_members
    d = join(g, 10, "c-123", require_known=True, new_id="unused")
    assert d.joins["c-123"].error == 0 and d.joins["c-123"].generation_id == 1
    assert not g.pending_members


def test_a_pending_member_id_that_never_comes_back_is_forgotten() -> None:
    g = stable_group("m1")
    join(g, 0, require_known=True, new_id="p")
    join(g, 100, "m1")  # a rebalance; it cannot end while "p" may still join
    assert g.tick(SESSION - 1).joins == {}
    d = g.tick(SESSION)  # "p" expired: everyone known has rejoined
    assert set(d.joins) == {"m1"} and not g.pending_members
    r = join(g, SESSION + 1, "p").reply
    assert r.error == E.UNKNOWN_MEMBER_ID


def test_initial_delay_is_extended_while_new_members_arrive() -> None:
    g = GroupMetadata("g", 0, initial_rebalance_delay_ms=1000)
    join(g, 0, new_id="a")
    join(g, 900, new_id="b")  # arrives during the delay: one more delay
    assert g.tick(1000).joins == {}
    d = g.tick(2000)
    assert set(d.joins) == {"a", "b"} and g.generation_id == 1


def test_protocol_selection_and_inconsistent_protocols() -> None:
    g = GroupMetadata("g", 0, initial_rebalance_delay_ms=100)
    join(g, 0, new_id="a", protocols=[("roundrobin", b"x"), ("range", b"y")])
    join(g, 0, new_id="b", protocols=[("range", b"y"), ("roundrobin", b"x")])
    join(g, 0, new_id="c", protocols=[("range", b"y")])
    g.tick(100)  # extended once for the members that came during the delay
    d = g.tick(200)
    assert set(d.joins) == {"a", "b", "c"}
    # Only "range" is supported by all three.
    assert {r.protocol_name for r in d.joins.values()} == {"range"}
    r = join(g, 1, new_id="d", protocols=[("sticky", b"z")]).reply
    assert r.error == E.INCONSISTENT_GROUP_PROTOCOL
    r = join(g, 1, new_id="e", protocol_type="connect").reply
    assert r.error == E.INCONSISTENT_GROUP_PROTOCOL
    empty = GroupMetadata("g2", 0)
    assert not empty.supports_protocols("consumer", [])
    assert not empty.supports_protocols("", RANGE)


def test_an_unchanged_follower_rejoining_a_stable_group_gets_its_generation_back() -> None:
    g = stable_group("m1", "m2")
    follower = "m2" if g.leader_id == "m1" else "m1"
    d = join(g, 100, follower)
    assert isinstance(d.reply, JoinResult) and d.reply.generation_id == 1
    assert g.state == GroupState.STABLE
    # The leader rejoining, or a member with new metadata, starts a rebalance.
    d = join(g, 100, follower, protocols=[("range", b"new-subscription")])
    assert d.reply is None and g.state == GroupState.PREPARING_REBALANCE


def test_a_failed_assignment_write_sends_the_members_back_to_join() -> None:
    g = GroupMetadata("g", 0, initial_rebalance_delay_ms=0)
    join(g, 0, new_id="m1")
    g.tick(0)
    g.sync(member_id="m1", generation_id=1, protocol_type=None, protocol_name=None,
           assignments={"m1": b"x"}, now_ms=1)
    d = g.on_store_complete(1, int(E.NOT_COORDINATOR), 2)
    assert d.syncs["m1"].error == E.NOT_COORDINATOR
    assert g.state == GroupState.PREPARING_REBALANCE


def test_a_new_member_that_never_completes_its_join_is_dropped() -> None:
    g = stable_group("m1")
    join(g, 0, new_id="slow")  # joins, then its client disappears
    d = join(g, 0, "m1")  # everybody joined: generation 2
    assert set(d.joins) == {"m1", "slow"}
    # "slow" never heartbeats nor syncs: its session ends.
    g.heartbeat("m1", 2, SESSION - 1)
    g.tick(SESSION)
    assert not g.has("slow") and g.state == GroupState.PREPARING_REBALANCE
    assert NEW_MEMBER_JOIN_TIMEOUT_MS > SESSION


def test_losing_the_partition_answers_waiting_requests_not_coordinator() -> None:
    g = stable_group("m1", "m2")
    join(g, 100, "m1")
    d = g.mark_dead()
    assert d.joins["m1"].error == E.NOT_COORDINATOR
    assert g.state == GroupState.DEAD
    assert g.heartbeat("m2", 1, 200) == E.COORDINATOR_NOT_AVAILABLE
    assert join(g, 200, "m2").reply.error == E.COORDINATOR_NOT_AVAILABLE


def test_simple_commits_from_outside_group_management() -> None:
    g = GroupMetadata("g", 0)
    assert g.validate_offset_commit("", -1, 0) == 0
    stable = stable_group("m1")
    assert stable.validate_offset_commit("", -1, 0) == E.UNKNOWN_MEMBER_ID
    g2 = stable_group("m1", "m2")
    join(g2, 10, new_id="m3")
    join(g2, 10, "m1")
    join(g2, 10, "m2")
    assert g2.state == GroupState.COMPLETING_REBALANCE
    assert g2.validate_offset_commit("m1", 2, 20) == E.REBALANCE_IN_PROGRESS


def test_loaded_group_is_stable_with_fresh_sessions() -> None:
    src = stable_group("m1", "m2")
    g = GroupMetadata.loaded("g", protocol_type="consumer", generation_id=src.generation_id,
                             protocol_name="range", leader_id=src.leader_id,
                             members=list(src.members.values()), now_ms=50_000)
    assert g.state == GroupState.STABLE and g.heartbeat("m1", 1, 50_001) == 0
    assert g.next_deadline_ms() == 50_000 + SESSION
    state, ptype, proto, members = g.summary()
    assert (state, ptype, proto) == ("Stable", "consumer", "range")
    assert {m.member_id: m.assignment for m in members} == {"m1": b"a-m1", "m2": b"a-m2"}


def static_join(g: GroupMetadata, now: int, instance: str, member_id: str = "", *,
                new_id: str, protocols: list[tuple[str, bytes]] | None = None) -> Any:
    return g.join(member_id=member_id, group_instance_id=instance, client_id="c",
                  client_host="/h", session_timeout_ms=SESSION, rebalance_timeout_ms=REBALANCE,
                  protocol_type="consumer", protocols=protocols or RANGE,
                  require_known_member_id=True, new_member_id=new_id, now_ms=now)


def test_a_static_member_joins_without_the_member_id_round_trip() -> None:
    g = GroupMetadata("g", 0, initial_rebalance_delay_ms=0)
    d = static_join(g, 0, "host-1", new_id="s1")
    assert d.joins["s1"].error == 0 and g.static_members == {"host-1": "s1"}


def test_a_restarted_static_member_takes_its_place_back_without_a_rebalance() -> None:
    g = GroupMetadata("g", 0, initial_rebalance_delay_ms=100)
    static_join(g, 0, "host-1", new_id="s1")
    join(g, 0, new_id="m2")
    g.tick(100)
    assert set(g.tick(200).joins) == {"s1", "m2"}
    g.sync(member_id=g.leader_id or "", generation_id=1, protocol_type=None, protocol_name=None,
           assignments={"s1": b"p0", "m2": b"p1"}, now_ms=200)
    g.on_store_complete(1, 0, 200)
    # host-1 restarts: it comes back with no member id, same metadata.
    d = static_join(g, 1000, "host-1", new_id="s1-again")
    r = d.reply
    assert isinstance(r, JoinResult) and r.error == 0 and r.member_id == "s1-again"
    assert r.generation_id == 1 and g.state == GroupState.STABLE
    assert d.store and d.assignment["s1-again"] == b"p0"  # the new id is written
    s = g.sync(member_id="s1-again", generation_id=1, protocol_type=None, protocol_name=None,
               assignments={}, now_ms=1001).reply
    assert s.assignment == b"p0"
    # The old incarnation is fenced everywhere.
    assert g.heartbeat("s1", 1, 1002, "host-1") == E.FENCED_INSTANCE_ID
    assert g.validate_offset_commit("s1", 1, 1002, "host-1") == E.FENCED_INSTANCE_ID
    assert static_join(g, 1002, "host-1", "s1", new_id="x").reply.error == E.FENCED_INSTANCE_ID
    assert g.leave([("s1", "host-1")], 1002)[0] == [E.FENCED_INSTANCE_ID]
    # Leaving by instance id alone removes the member and rebalances the rest.
    errors, _ = g.leave([("", "host-1")], 1003)
    assert errors == [0] and not g.has("s1-again") and g.static_members == {}
    assert g.state == GroupState.PREPARING_REBALANCE
    assert g.leave([("", "host-1")], 1004)[0] == [E.UNKNOWN_MEMBER_ID]


def test_a_static_member_back_with_new_metadata_triggers_a_rebalance() -> None:
    g = GroupMetadata("g", 0, initial_rebalance_delay_ms=0)
    static_join(g, 0, "host-1", new_id="s1")
    g.sync(member_id="s1", generation_id=1, protocol_type=None, protocol_name=None,
           assignments={"s1": b"all"}, now_ms=0)
    g.on_store_complete(1, 0, 0)
    d = static_join(g, 10, "host-1", new_id="s1b", protocols=[("range", b"new-topics")])
    assert d.joins["s1b"].generation_id == 2 and g.leader_id == "s1b"
