"""The reassignment phases' write of the topic znode (controller/reassignment_manager.py), run
by the simulated controller over the simulator's ZooKeeper."""

from __future__ import annotations

from typing import Any

from tidelog.controller.reassignment import ApiError
from tidelog.sim.cluster import SimCluster, SimConfig


def test_a_partition_added_while_the_controller_rewrites_the_topic_znode_is_kept() -> None:
    # An admin's CreatePartitions lands between the controller's read of /brokers/topics/t and
    # its write (the reassignment's phase A): an unconditional write would drop the acknowledged
    # partition 1 for good; the write is conditional on the version read, merged again.
    c = SimCluster(SimConfig())
    c.start()
    c.run_for(300)
    assert c.controller is not None
    zk = c.zk
    write = zk.set_topic_assignment
    raced: list[int] = []

    def admin_writes_first(topic: str, assignment: Any, *args: Any, **kwargs: Any) -> int:
        if kwargs.get("expected_epoch_zk_version") is not None and not raced:
            parts = zk.get_topic_assignment(topic) or {}
            raced.append(write(topic, {**parts, 1: [1, 2, 0]}))
        return write(topic, assignment, *args, **kwargs)

    zk.set_topic_assignment = admin_writes_first  # type: ignore[method-assign]
    assert c.controller.reassign({c.tps[0]: [0, 2]}) == {c.tps[0]: ApiError(0)}
    assert raced
    c.run_for(300)
    assert (zk.get_topic_assignment("t") or {}).get(1) == [1, 2, 0]
    assert len(c.tps) == 2
    s = c.zk_state(c.tps[1])
    assert s is not None and s.leader == 1 and set(s.isr) == {0, 1, 2}
