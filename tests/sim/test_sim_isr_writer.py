"""The simulator's ISR writer (a node's AlterPartitionManager, AlterPartition to the simulated
controller) is refused an ISR whose member is unregistered or named with another broker epoch
than its registration's: the controller's INELIGIBLE_REPLICA (KIP-841/903), the code the real
controller runs (ControllerCore.alter_partition)."""

from __future__ import annotations

from tidelog.replication.types import ProposeIsr
from tidelog.sim.cluster import SimCluster, SimConfig


def _propose(c: SimCluster, members: tuple[tuple[int, int], ...]) -> list[tuple[bool, int]]:
    """Broker 0 (the leader) writes an ISR of ``members`` (id, broker epoch); the answers."""
    tp = c.tps[0]
    s = c.zk_state(tp)
    assert s is not None and s.leader == 0
    answers: list[tuple[bool, int]] = []
    manager = c.nodes[0].alter_partition
    assert manager is not None
    manager.submit(ProposeIsr(tp, 0, s.leader_epoch, tuple(m for m, _ in members),
                                 s.zk_version, s.controller_epoch, members),
                      lambda ok, version: answers.append((ok, version)))
    c.run_for(100)
    return answers


def test_a_member_named_with_an_earlier_registration_is_refused() -> None:
    c = SimCluster(SimConfig())
    c.start()
    c.run_for(200)
    tp = c.tps[0]
    e0, e1 = c.nodes[0].broker_epoch, c.nodes[1].broker_epoch
    assert _propose(c, ((0, e0), (1, e1 - 1))) == [(False, -1)]
    assert _propose(c, ((0, e0), (3, -1))) == [(False, -1)]  # no broker 3 registered
    assert set(c.zk_state(tp).isr) == {0, 1, 2}
    # The epochs of the registrations (or -1, unchecked): written.
    [(ok, _)] = _propose(c, ((0, e0), (1, -1)))
    assert ok and c.zk_state(tp).isr == (0, 1)
