"""Random leader-side histories: the HW invariants of DESIGN.md hold after every step."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from replication_helpers import fetch, leader_partition, records

from tidelog.replication import ReplicationConfig

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 4)),
        st.tuples(st.just("fetch"), st.sampled_from([2, 3]), st.integers(0, 6)),  # catch-up step
        st.tuples(st.just("tick"), st.integers(1, 3_000)),
        st.tuples(st.just("shrink")),
        st.tuples(st.just("isr_result"), st.booleans()),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(1, 3))
def test_hw_is_monotonic_and_never_above_a_maximal_isr_member(history, min_isr: int) -> None:
    p = leader_partition(ReplicationConfig(replica_lag_time_max_ms=2_000),
                         min_insync_replicas=min_isr)
    now = 0
    follower_leo = {2: 0, 3: 0}
    for rid in (2, 3):
        fetch(p, rid, 0, now)
    hw = p.high_watermark
    version = 0
    for op in history:
        kind = op[0]
        if kind == "append":
            try:
                p.append_records_to_leader(records(op[1]), acks=1, now_ms=now)
            except Exception as e:  # noqa: BLE001 - only storage errors could occur; none expected
                raise AssertionError(e) from e
        elif kind == "fetch":
            rid, step = op[1], op[2]
            follower_leo[rid] = min(p.log_end_offset, follower_leo[rid] + step)
            proposal = fetch(p, rid, follower_leo[rid], now)
            assert proposal is None or set(proposal.new_isr) == p.isr | {rid}
        elif kind == "tick":
            now += op[1]
        elif kind == "shrink":
            proposal = p.maybe_shrink_isr(now)
            assert proposal is None or set(proposal.new_isr) < p.isr
        elif kind == "isr_result" and p.pending_isr is not None:
            pending = tuple(sorted(p.pending_isr))
            version += op[1]
            p.on_isr_update_result(op[1], version, pending)
        # invariants
        assert p.high_watermark >= hw, "HW went backwards"
        hw = p.high_watermark
        assert 1 in p.isr and (p.pending_isr is None or 1 in p.pending_isr)
        assert hw <= p.log_end_offset
        for rid in p.maximal_isr - {1}:
            assert hw <= p.remote_replicas[rid].log_end_offset, "HW above a maximal-ISR member"
        if len(p.maximal_isr) < min_isr:
            assert p.maybe_increment_leader_hw() is False
