"""The simulated controller runs the real controller's execute loop over the simulated
ZooKeeper: KIP-966 marks persisted in ZooKeeper outlive a controller failover, and a deposed
controller's writes are fenced."""

from __future__ import annotations

import pytest

from tidelog.controller.zk_interface import ControllerMovedError
from tidelog.sim.cluster import SimConfig
from tidelog.sim.scenarios import ScenarioRun, fetch_requests


def test_a_failover_keeps_the_kip966_marks_and_fences_the_old_controller() -> None:
    sc = ScenarioRun("marks", False, SimConfig(seed=7))
    sc.boot()
    sc.produce(3)
    tp, key = sc.tp, (sc.tp.topic, sc.tp.partition)
    leader = sc.zk().leader
    follower = next(b for b in sc.cluster.assignments[tp] if b != leader)
    sc.stop(follower, "kill")  # an unclean shutdown
    assert sc.wait_gone(follower)
    cut = sc.rule(fetch_requests(follower, leader))  # it cannot catch up once back
    sc.start(follower)
    assert sc.wait_registered(follower)
    old = sc.cluster.controller
    assert old is not None and old.core.unclean_restarted.get(tp) == {follower}
    assert sc.cluster.zk.get_unclean_replicas() == {key: {follower}}
    # A clean restart before catching up: its registration no longer tells (seed 13's case),
    # only the marks in ZooKeeper do.
    sc.stop(follower, "clean")
    assert sc.wait_gone(follower)
    sc.start(follower)
    assert sc.wait_registered(follower)
    assert old.core.unclean_restarted.get(tp) == {follower}

    sc.cluster.failover_controller()
    sc.run_for(200)
    new = sc.cluster.controller
    assert new is not old and new is not None
    assert new.core.unclean_restarted.get(tp) == {follower}  # read back from ZooKeeper
    with pytest.raises(ControllerMovedError):  # the old one's epoch znode version is stale
        old.executor.execute(lambda: old.core.on_broker_failure(leader))

    sc.unrule(cut)  # back in the ISR under the leader: the mark goes, in ZooKeeper too
    assert sc.run_until(lambda: sc.isr_is(set(sc.cluster.assignments[tp])))
    assert sc.run_until(lambda: sc.cluster.zk.get_unclean_replicas() == {})
    assert not new.core.unclean_restarted.get(tp)
