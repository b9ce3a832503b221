"""TransactionTracker against a naive model: the first unstable offset is the least first offset
of the open transactions and of the completed ones whose marker the HW has not passed, through
random begins, markers, HW moves and truncations."""

from __future__ import annotations

import random

import pytest

from tidelog.storage.transactions import TransactionTracker, TxnBatch


@pytest.mark.parametrize("seed", range(20))
def test_the_first_unstable_offset_matches_a_naive_model(seed: int) -> None:
    rng = random.Random(seed)
    tracker = TransactionTracker()
    ongoing: dict[int, int] = {}
    completed: list[tuple[int, int, int]] = []  # (pid, first offset, marker offset)
    offset = hw = 0
    for _ in range(400):
        pid = rng.randrange(6)
        action = rng.random()
        if action < 0.45:
            tracker.append([TxnBatch(pid, 0, offset, offset, True)], hw)
            ongoing.setdefault(pid, offset)
            offset += 1
        elif action < 0.8:
            tracker.append([TxnBatch(pid, 0, offset, offset, True, (rng.random() < 0.5, 0))], hw)
            if pid in ongoing:
                completed.append((pid, ongoing.pop(pid), offset))
            offset += 1
        elif action < 0.95:
            hw = rng.randint(hw, offset)
            tracker.on_high_watermark_updated(hw)
        else:
            cut = rng.randint(hw, offset)
            if tracker.truncate(cut):
                offset = cut
                ongoing = {p: f for p, f in ongoing.items() if f < cut}
                for p, first, _ in [c for c in completed if c[2] >= cut]:
                    if first < cut:
                        ongoing[p] = first
                completed = [c for c in completed if c[2] < cut]
        unstable = list(ongoing.values()) + [first for _, first, marker in completed
                                             if marker >= hw]
        assert tracker.first_unstable_offset == (min(unstable) if unstable else None)
