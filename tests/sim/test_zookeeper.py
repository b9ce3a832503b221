"""The simulated ZooKeeper: versions and compare-and-set, ephemeral znodes, session expiry,
one-shot watches delivered as events."""

from __future__ import annotations

from tidelog.sim.clock import Scheduler
from tidelog.sim.zookeeper import SimZooKeeper, ZkCode


def test_set_data_is_a_compare_and_set_on_the_version():
    zk = SimZooKeeper(Scheduler())
    assert zk.create("/a/b", {"isr": [1, 2]})[0] is ZkCode.OK
    code, stat = zk.set_data("/a/b", {"isr": [1]}, version=0)
    assert code is ZkCode.OK and stat.version == 1
    code, stat = zk.set_data("/a/b", {"isr": [2]}, version=0)
    assert code is ZkCode.BAD_VERSION and stat.version == 1
    assert zk.get("/a/b")[0] == {"isr": [1]}


def test_ephemeral_znode_disappears_when_its_session_expires_and_watch_fires():
    s = Scheduler()
    zk = SimZooKeeper(s, tick_ms=100)
    zk.start()
    sid = zk.create_session(1000)
    code, _ = zk.create("/brokers/ids/1", {}, session_id=sid)
    czxid = zk.exists("/brokers/ids/1").czxid
    events: list[tuple[str, str]] = []
    zk.get_children("/brokers/ids", watch=lambda e, p: events.append((e, p)))
    s.run_until(900)
    assert zk.touch(sid)  # a ping keeps it alive
    s.run_until(1800)
    assert zk.exists("/brokers/ids/1") is not None
    s.run_until(3000)
    assert zk.exists("/brokers/ids/1") is None
    assert events == [("child", "/brokers/ids")]
    assert not zk.touch(sid)
    # A new session registers again with a new creation zxid: the new broker epoch.
    sid2 = zk.create_session(1000)
    zk.create("/brokers/ids/1", {}, session_id=sid2)
    assert zk.exists("/brokers/ids/1").czxid > czxid


def test_an_expired_session_cannot_write():
    s = Scheduler()
    zk = SimZooKeeper(s)
    sid = zk.create_session(10)
    zk.create("/x", 1)
    zk.expire(sid)
    assert zk.set_data("/x", 2, session_id=sid)[0] is ZkCode.SESSION_EXPIRED
    assert zk.create("/y", 1, session_id=sid)[0] is ZkCode.SESSION_EXPIRED


def test_node_exists_while_the_previous_registration_lives():
    zk = SimZooKeeper(Scheduler())
    a = zk.create_session(1000)
    b = zk.create_session(1000)
    assert zk.create("/brokers/ids/2", {}, session_id=a)[0] is ZkCode.OK
    assert zk.create("/brokers/ids/2", {}, session_id=b)[0] is ZkCode.NODE_EXISTS


def test_sequential_znodes_and_watches_are_one_shot():
    s = Scheduler()
    zk = SimZooKeeper(s)
    fired: list[str] = []
    zk.get_children("/isr_change_notification", watch=lambda e, p: fired.append(p))
    _, p1 = zk.create("/isr_change_notification/isr_change_", [1], sequential=True)
    _, p2 = zk.create("/isr_change_notification/isr_change_", [2], sequential=True)
    s.run_until(10)
    assert p1.endswith("0000000000") and p2.endswith("0000000001")
    assert fired == ["/isr_change_notification"]
    assert zk.get_children("/isr_change_notification") == ["isr_change_0000000000",
                                                           "isr_change_0000000001"]
