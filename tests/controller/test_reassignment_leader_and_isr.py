"""LeaderAndIsr during a reassignment carries the partition's adding and removing replicas, as
Kafka's ControllerChannelManager sends them from the full ReplicaAssignment (v3+): in phase A
(RS = TRS + ORS) and in any other LeaderAndIsr while the move lasts, and none once phase B
set RS = TRS. Real controller, real ZooKeeper, brokers played by listeners decoding the wire."""

from __future__ import annotations

from typing import Any

import pytest
from test_controller import Cluster, lai_states, wait_for, with_cluster
from test_reassignment_controller import TP, four_brokers, leader_adds_to_isr, reassign

from tidelog.controller.reassignment import ApiError
from tidelog.protocol.api_keys import ApiKey

pytestmark = pytest.mark.timeout(120)


def received(cluster: Cluster, broker: int) -> list[tuple[list[int], list[int], list[int]]]:
    """(replicas, adding, removing) of every LeaderAndIsr state of TP `broker` received."""
    out = []
    for body in cluster.brokers[broker].of(ApiKey.LEADER_AND_ISR):
        s = lai_states(body).get(TP)
        if s is not None:
            out.append((list(s.replicas), list(s.adding_replicas), list(s.removing_replicas)))
    return out


def states(cluster: Cluster, broker: int) -> list[Any]:
    return [lai_states(body)[TP] for body in cluster.brokers[broker].of(ApiKey.LEADER_AND_ISR)
            if TP in lai_states(body)]


@with_cluster
async def test_a_move_sends_its_adding_and_removing_replicas_until_it_completes(
        cluster: Cluster) -> None:
    ctl = await four_brokers(cluster)
    assert all(adding == [] and removing == []
               for b in (1, 2, 3) for _, adding, removing in received(cluster, b))
    assert await reassign(ctl, [2, 3, 4]) == ApiError(0)
    moving = ([2, 3, 4, 1], [4], [1])
    for b in (1, 2, 3, 4):
        await wait_for(lambda b=b: moving in received(cluster, b), what=f"RS to broker {b}")
    await ctl.wait_idle()
    # To the joining broker the partition is new (Kafka's NewReplica): it may create the log
    # even with a log dir offline; to the others it is not.
    assert [s.is_new for s in states(cluster, 4)] == [True]
    assert not states(cluster, 2)[-1].is_new
    # Broker 3 fails and comes back while moving: the ISR shrink and the resend to the
    # restarted broker carry the full assignment too.
    others = (1, 2, 4)
    before = {b: len(received(cluster, b)) for b in others}
    await cluster.brokers[3].deregister()
    await wait_for(lambda: any(len(received(cluster, b)) > before[b] for b in others),
                   what="a LeaderAndIsr after broker 3 failed")
    assert all(r == moving for b in others for r in received(cluster, b)[before[b]:])
    seen_by_3 = len(received(cluster, 3))
    await cluster.brokers[3].register()
    await wait_for(lambda: len(received(cluster, 3)) > seen_by_3, what="broker 3 hears again")
    assert received(cluster, 3)[-1] == moving
    await ctl.wait_idle()
    # Phase B: RS = TRS, nothing adding or removing any more.
    await leader_adds_to_isr(cluster, (1, 2, 3, 4))
    for b in (2, 3, 4):
        await wait_for(lambda b=b: ([2, 3, 4], [], []) in received(cluster, b),
                       what=f"TRS to broker {b}")
    assert ctl.core is not None and ctl.core.reassigning == {}
