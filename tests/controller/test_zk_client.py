from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, NodeExistsError, UnimplementedError

from tidelog.controller.zk_client import (
    BrokerAlreadyRegisteredError,
    ControllerMovedError,
    KafkaZkClient,
    NoTopicError,
    TopicExistsError,
    ZkClientError,
)
from tidelog.controller.zk_data import (
    BrokerEndPoint,
    BrokerInfo,
    LeaderIsrAndControllerEpoch,
    log_dir_event_sequence_number,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def make_client(zk_connect: str) -> Iterator[Callable[..., KafkaZkClient]]:
    clients: list[KafkaZkClient] = []

    def make(session_timeout_ms: int = 6000) -> KafkaZkClient:
        client = KafkaZkClient(zk_connect, session_timeout_ms=session_timeout_ms).start()
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.close()


def broker(broker_id: int, port: int = 9092) -> BrokerInfo:
    return BrokerInfo(broker_id, (BrokerEndPoint("PLAINTEXT", "127.0.0.1", port),))


def wait_for(predicate: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


# --- layout ---------------------------------------------------------------------------------


def test_start_creates_kafkas_persistent_paths(make_client: Callable[..., KafkaZkClient]) -> None:
    zk = make_client().kazoo
    for path in ("/brokers/ids", "/brokers/topics", "/brokers/seqid", "/admin/delete_topics",
                 "/isr_change_notification", "/config/topics", "/config/changes"):
        assert zk.exists(path) is not None, path


def test_unreachable_zookeeper_is_a_bounded_error() -> None:
    client = KafkaZkClient("127.0.0.1:1", session_timeout_ms=2000, connection_timeout_ms=1000)
    started = time.monotonic()
    with pytest.raises(ZkClientError, match="could not connect"):
        client.start()
    assert time.monotonic() - started < 30


# --- broker registration --------------------------------------------------------------------


def test_broker_epoch_is_the_registration_czxid_and_json_is_kafkas(
    make_client: Callable[..., KafkaZkClient],
) -> None:
    client = make_client()
    epoch = client.register_broker(broker(1, 9093))
    data, stat = client.kazoo.get("/brokers/ids/1")
    assert epoch == stat.czxid
    assert stat.ephemeralOwner == client.session_id
    obj = json.loads(data)
    assert obj["version"] == 4
    assert (obj["host"], obj["port"]) == ("127.0.0.1", 9093)
    assert obj["endpoints"] == ["PLAINTEXT://127.0.0.1:9093"]
    assert obj["listener_security_protocol_map"] == {"PLAINTEXT": "PLAINTEXT"}
    assert obj["jmx_port"] == -1
    assert int(obj["timestamp"]) > 0
    assert client.get_broker(1) == (broker(1, 9093), epoch)
    assert client.broker_epoch == epoch


def test_same_id_is_refused_while_the_first_session_lives(
    make_client: Callable[..., KafkaZkClient],
) -> None:
    first, second = make_client(), make_client()
    epoch = first.register_broker(broker(1))
    with pytest.raises(BrokerAlreadyRegisteredError, match="broker 1"):
        second.register_broker(broker(1, 9999))
    assert second.get_broker(1) == (broker(1), epoch)
    # A retried create in the owning session is not a conflict.
    assert first.register_broker(broker(1)) == epoch


def test_reregistration_after_session_close_gets_a_larger_epoch(
    make_client: Callable[..., KafkaZkClient],
) -> None:
    first = make_client()
    old_epoch = first.register_broker(broker(2))
    first.close()
    second = make_client()
    assert second.get_broker(2) is None  # the ephemeral went with the session
    new_epoch = second.register_broker(broker(2))
    assert new_epoch > old_epoch


def test_broker_listing_and_change_watch(make_client: Callable[..., KafkaZkClient]) -> None:
    observer = make_client()
    seen: list[list[int]] = []
    handle = observer.watch_broker_changes(seen.append)
    b1, b2 = make_client(), make_client()
    e1 = b1.register_broker(broker(1))
    e2 = b2.register_broker(broker(2))
    wait_for(lambda: seen and seen[-1] == [1, 2])
    assert observer.get_all_broker_ids() == [1, 2]
    assert {k: v[1] for k, v in observer.get_all_brokers_and_epochs().items()} == {1: e1, 2: e2}
    b1.close()
    wait_for(lambda: seen[-1] == [2])
    handle.cancel()
    b2.close()
    assert observer.get_all_broker_ids() == []
    observer.sync_watches()  # the watch for that change has fired and its callback has run
    assert seen[-1] == [2]  # cancelled: no callback for the last change


def test_generate_broker_id_counts_up_from_the_reserved_range(
    make_client: Callable[..., KafkaZkClient],
) -> None:
    client = make_client()
    first = client.generate_broker_id(1000)
    second = client.generate_broker_id(1000)
    assert first > 1000 and second == first + 1


def test_cluster_id_is_created_once(make_client: Callable[..., KafkaZkClient]) -> None:
    a, b = make_client(), make_client()
    cluster_id = a.get_or_create_cluster_id()
    assert len(cluster_id) == 22
    assert b.get_or_create_cluster_id("other") == cluster_id


# --- session expiry -----------------------------------------------------------------------------


def expire_session(zk_connect: str, client: KafkaZkClient) -> None:
    """Expire `client`'s session for real: a second connection with its id and password
    takes the session over and closes it (the standard ZooKeeper test technique)."""
    session_id, password = client.kazoo.client_id
    thief = KazooClient(hosts=zk_connect, client_id=(session_id, password), timeout=6.0)
    thief.start(timeout=15)
    thief.stop()
    thief.close()


def test_session_expiry_reregisters_the_broker_with_a_new_epoch(
    zk_connect: str, make_client: Callable[..., KafkaZkClient]
) -> None:
    client = make_client(session_timeout_ms=4000)
    old_epoch = client.register_broker(broker(7))
    old_session = client.session_id
    expired = threading.Event()
    new_epochs: list[int] = []
    client.on_session_expired(expired.set)
    client.on_new_session(new_epochs.append)

    expire_session(zk_connect, client)

    wait_for(lambda: bool(new_epochs), timeout_s=30)
    assert expired.is_set()
    assert client.session_id != old_session
    assert new_epochs[0] > old_epoch
    found = client.get_broker(7)
    assert found is not None and found[1] == new_epochs[0] == client.broker_epoch


# --- controller election ------------------------------------------------------------------------


def test_one_winner_among_two_and_epoch_increments(
    make_client: Callable[..., KafkaZkClient],
) -> None:
    a, b = make_client(), make_client()
    assert a.get_controller_epoch() is None
    won = a.try_elect_controller(1)
    lost = b.try_elect_controller(2)
    assert tuple(won) == (True, 1, 1)
    assert (lost.elected, lost.controller_epoch, lost.controller_id) == (False, 1, 1)
    assert a.get_controller_id() == 1
    data, stat = a.kazoo.get("/controller")
    assert json.loads(data)["brokerid"] == 1 and json.loads(data)["version"] == 1
    assert stat.ephemeralOwner == a.session_id
    assert a.get_controller_epoch() == (1, 1)
    assert a.kazoo.get("/controller_epoch")[0] == b"1"


def test_concurrent_elections_have_exactly_one_winner(
    make_client: Callable[..., KafkaZkClient],
) -> None:
    clients = [make_client() for _ in range(4)]
    results: dict[int, Any] = {}
    barrier = threading.Barrier(len(clients))

    def run(i: int) -> None:
        barrier.wait()
        results[i] = clients[i].try_elect_controller(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [i for i, r in results.items() if r.elected]
    assert len(results) == 4 and len(winners) == 1
    assert clients[0].get_controller_id() == winners[0]
    assert clients[0].get_controller_epoch() == (1, 1)


def test_failover_when_the_controller_session_closes(
    make_client: Callable[..., KafkaZkClient],
) -> None:
    a, b = make_client(), make_client()
    assert a.try_elect_controller(1).elected
    seen: list[int | None] = []
    b.watch_controller(seen.append)
    wait_for(lambda: seen == [1])
    a.close()
    wait_for(lambda: seen[-1] is None)
    election = b.try_elect_controller(2)
    assert tuple(election) == (True, 2, 2)
    wait_for(lambda: seen[-1] == 2)


def test_resign_only_deletes_our_own_controller_node(
    make_client: Callable[..., KafkaZkClient],
) -> None:
    a, b = make_client(), make_client()
    _, _, version = a.try_elect_controller(1)
    assert not b.resign_controller(version)
    assert not a.resign_controller(version + 1)  # a stale epoch version does not resign
    assert a.resign_controller(version)
    assert a.get_controller_id() is None


# --- partition state ------------------------------------------------------------------------------


def test_partition_state_create_read_and_cas(make_client: Callable[..., KafkaZkClient]) -> None:
    client = make_client()
    _, _, epoch_version = client.try_elect_controller(1)
    tp = ("orders", 0)
    state = LeaderIsrAndControllerEpoch(leader=1, leader_epoch=0, isr=(1, 2, 3), controller_epoch=1)
    with pytest.raises(NoTopicError):  # no topic, no partition state
        client.create_partition_state(tp, state, epoch_version)
    client.create_topic("orders", {0: [1, 2, 3]})
    assert client.create_partition_state(tp, state, epoch_version) == 0
    raw = json.loads(client.kazoo.get("/brokers/topics/orders/partitions/0/state")[0])
    assert raw == {"controller_epoch": 1, "leader": 1, "version": 1, "leader_epoch": 0,
                   "isr": [1, 2, 3]}
    read = client.get_partition_state(tp)
    assert read == LeaderIsrAndControllerEpoch(1, 0, (1, 2, 3), 1, zk_version=0)

    shrunk = LeaderIsrAndControllerEpoch(1, 0, (1, 2), 1)
    assert client.update_leader_and_isr(tp, shrunk, expected_zk_version=0) == (True, 1)
    # The same write retried (as after a connection loss) is recognised as already done.
    assert client.update_leader_and_isr(tp, shrunk, expected_zk_version=0) == (True, 1)
    # A different state with the stale version is refused.
    other = LeaderIsrAndControllerEpoch(2, 1, (2,), 1)
    assert client.update_leader_and_isr(tp, other, expected_zk_version=0) == (False, -1)
    assert client.get_partition_state(tp) == LeaderIsrAndControllerEpoch(1, 0, (1, 2), 1, 1)
    with pytest.raises(NodeExistsError):
        client.create_partition_state(tp, state, epoch_version)
    assert client.get_partition_state(("orders", 5)) is None
    assert client.update_leader_and_isr(("orders", 5), state, 0) == (False, -1)


def test_a_deposed_controller_cannot_write_partition_state(
    make_client: Callable[..., KafkaZkClient],
) -> None:
    old, new = make_client(), make_client()
    _, _, old_version = old.try_elect_controller(1)
    tp = ("t", 0)
    old.create_topic("t", {0: [1, 2], 1: [1, 2]})
    old.create_partition_state(tp, LeaderIsrAndControllerEpoch(1, 0, (1, 2), 1), old_version)
    old.close()  # /controller goes; /controller_epoch stays at 1
    elected, epoch, new_version = new.try_elect_controller(2)
    assert elected and epoch == 2

    zombie = make_client()  # the old controller's view: epoch version 1, state version 0
    with pytest.raises(ControllerMovedError):
        zombie.update_leader_and_isr(
            tp, LeaderIsrAndControllerEpoch(1, 1, (1,), 1), 0, expected_epoch_zk_version=old_version
        )
    with pytest.raises(ControllerMovedError):
        zombie.create_partition_state(("t", 1), LeaderIsrAndControllerEpoch(1, 0, (1,), 1),
                                      old_version)
    assert new.get_partition_state(tp) == LeaderIsrAndControllerEpoch(1, 0, (1, 2), 1, 0)
    ok, version = new.update_leader_and_isr(
        tp, LeaderIsrAndControllerEpoch(2, 1, (2,), 2), 0, expected_epoch_zk_version=new_version
    )
    assert (ok, version) == (True, 1)


# --- topics, deletion, configs ----------------------------------------------------------------


def test_topic_creation_layout_and_watch(make_client: Callable[..., KafkaZkClient]) -> None:
    admin, controller = make_client(), make_client()
    seen: list[set[str]] = []
    controller.watch_topic_changes(seen.append)
    admin.create_topic("orders", {0: [1, 2, 3], 1: [2, 3, 1]}, {"retention.ms": 1000,
                                                                  "cleanup.policy": ["delete"]})
    raw = json.loads(admin.kazoo.get("/brokers/topics/orders")[0])
    assert raw == {"version": 2, "partitions": {"0": [1, 2, 3], "1": [2, 3, 1]},
                   "adding_replicas": {}, "removing_replicas": {}}
    assert json.loads(admin.kazoo.get("/config/topics/orders")[0]) == {
        "version": 1, "config": {"retention.ms": "1000", "cleanup.policy": "delete"}}
    assert controller.get_topic_assignment("orders") == {0: [1, 2, 3], 1: [2, 3, 1]}
    assert controller.get_topic_config("orders") == {"retention.ms": "1000",
                                                     "cleanup.policy": "delete"}
    assert controller.get_all_topics() == {"orders"}
    assert controller.get_partitions_for_topics(["orders", "nope"]) == {"orders": [0, 1]}
    wait_for(lambda: bool(seen) and seen[-1] == {"orders"})
    with pytest.raises(TopicExistsError):
        admin.create_topic("orders", {0: [1]})

    assigned: list[Any] = []
    controller.watch_topic_assignment("orders", assigned.append)
    version = admin.set_topic_assignment("orders", {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]})
    assert version == 1
    wait_for(lambda: bool(assigned) and assigned[-1] is not None and 2 in assigned[-1])


def test_topic_config_change_writes_a_notification(
    make_client: Callable[..., KafkaZkClient],
) -> None:
    client = make_client()
    client.create_topic("t", {0: [1]})
    client.set_topic_config("t", {"retention.ms": "5"})
    changes = client.kazoo.get_children("/config/changes")
    assert len(changes) == 1 and changes[0].startswith("config_change_")
    data, _ = client.kazoo.get(f"/config/changes/{changes[0]}")
    assert json.loads(data) == {"version": 2, "entity_path": "topics/t"}
    assert client.get_topic_config("t") == {"retention.ms": "5"}
    assert client.get_topic_config("missing") == {}


def test_config_change_notifications_older_than_the_expiration_are_purged(
    make_client: Callable[..., KafkaZkClient],
) -> None:
    client = make_client()
    client.create_topic("t", {0: [1]})
    client.set_topic_config("t", {"retention.ms": "5"})
    client.set_topic_config("t", {"retention.ms": "6"})
    first, second = sorted(client.kazoo.get_children("/config/changes"))
    ctime = client.kazoo.exists(f"/config/changes/{second}").ctime
    fifteen_min = 15 * 60 * 1000
    # Kafka deletes a notification once now - ctime > changeExpirationMs (not at equality).
    assert client.purge_obsolete_config_changes([first, second], ctime + fifteen_min,
                                                fifteen_min) in ([], [first])
    assert second in client.kazoo.get_children("/config/changes")
    assert client.purge_obsolete_config_changes([first, second], ctime + fifteen_min + 1,
                                                fifteen_min) in ([first, second], [second])
    assert client.kazoo.get_children("/config/changes") == []
    assert client.purge_obsolete_config_changes([first], ctime + 2 * fifteen_min,
                                                fifteen_min) == []  # already gone
    assert client.get_topic_config("t") == {"retention.ms": "6"}


def test_delete_topic_request_watch_and_cleanup(
    make_client: Callable[..., KafkaZkClient],
) -> None:
    admin, controller = make_client(), make_client()
    _, _, epoch_version = controller.try_elect_controller(1)
    admin.create_topic("gone", {0: [1], 1: [1]}, {"retention.ms": "1"})
    for p in (0, 1):
        controller.create_partition_state(("gone", p), LeaderIsrAndControllerEpoch(1, 0, (1,), 1),
                                          epoch_version)
    requested: list[set[str]] = []
    controller.watch_delete_topics(requested.append)
    admin.create_delete_topic_path("gone")
    admin.create_delete_topic_path("gone")  # idempotent
    wait_for(lambda: bool(requested) and requested[-1] == {"gone"})
    assert controller.is_topic_marked_for_deletion("gone")
    assert controller.get_topic_deletions() == {"gone"}

    controller.delete_topic_znodes("gone", epoch_version)
    controller.delete_topic_deletions(["gone"], epoch_version)
    assert not controller.topic_exists("gone")
    assert controller.kazoo.exists("/config/topics/gone") is None
    assert controller.get_topic_deletions() == set()
    wait_for(lambda: requested[-1] == set())


def test_delete_topic_znodes_is_fenced(make_client: Callable[..., KafkaZkClient]) -> None:
    client = make_client()
    _, _, version = client.try_elect_controller(1)
    client.create_topic("keep", {0: [1]})
    with pytest.raises(ControllerMovedError):
        client.delete_topic_znodes("keep", version + 5)
    assert client.topic_exists("keep")


# --- ISR change notifications -------------------------------------------------------------------


def test_isr_change_notifications_round_trip(make_client: Callable[..., KafkaZkClient]) -> None:
    leader, controller = make_client(), make_client()
    _, _, epoch_version = controller.try_elect_controller(1)
    seen: list[list[str]] = []
    controller.watch_isr_change_notifications(seen.append)

    first = leader.propagate_isr_changes([("a", 0), ("a", 1)])
    second = leader.propagate_isr_changes([("b", 0), ("a", 1)])
    assert first.startswith("isr_change_") and second > first
    raw = json.loads(leader.kazoo.get(f"/isr_change_notification/{first}")[0])
    assert raw == {"version": 1, "partitions": [{"topic": "a", "partition": 0},
                                                {"topic": "a", "partition": 1}]}

    seqs = controller.get_all_isr_change_notifications()
    assert len(seqs) == 2 and seqs == sorted(seqs)
    assert controller.get_partitions_from_isr_change_notifications(seqs) == {
        ("a", 0), ("a", 1), ("b", 0)}
    wait_for(lambda: bool(seen) and len(seen[-1]) == 2)

    controller.delete_isr_change_notifications(seqs, epoch_version)
    assert controller.get_all_isr_change_notifications() == []
    wait_for(lambda: seen[-1] == [])
    # Reading a notification that another controller already deleted is not an error.
    assert controller.get_partitions_from_isr_change_notifications(seqs) == set()


def test_a_deposed_controller_cannot_delete_isr_notifications(
    make_client: Callable[..., KafkaZkClient],
) -> None:
    client = make_client()
    _, _, epoch_version = client.try_elect_controller(1)
    client.propagate_isr_changes([("a", 0)])
    with pytest.raises(ControllerMovedError):
        client.delete_isr_change_notifications(None, epoch_version + 1)
    assert len(client.get_all_isr_change_notifications()) == 1


def test_watches_survive_a_session_expiry(
    zk_connect: str, make_client: Callable[..., KafkaZkClient]
) -> None:
    observer = make_client(session_timeout_ms=4000)
    seen: list[int | None] = []
    observer.watch_controller(seen.append)
    wait_for(lambda: seen == [None])
    renewed = threading.Event()
    observer.on_new_session(lambda epoch: renewed.set())
    expire_session(zk_connect, observer)
    assert renewed.wait(30)
    other = make_client()
    assert other.try_elect_controller(9).elected
    wait_for(lambda: seen[-1] == 9)


def test_client_from_kafka_config(zookeeper: Any, zk_connect: str) -> None:
    from tidelog.broker.config import KafkaConfig

    config = KafkaConfig.from_text(
        f"zookeeper.connect={zk_connect}\nzookeeper.session.timeout.ms=5000\n"
    )
    client = KafkaZkClient.from_config(config)
    assert (client.session_timeout_ms, client.connection_timeout_ms) == (5000, 5000)
    with client:
        assert client.connected
        info = BrokerInfo.from_endpoints(1, config.advertised_listeners)
        assert client.register_broker(info) > 0
    assert not client.connected


def test_batched_partition_state_writes(make_client: Callable[..., KafkaZkClient]) -> None:
    client = make_client()
    _, _, epoch_version = client.try_elect_controller(1)
    client.create_topic("big", {p: [1, 2] for p in range(20)})
    states = {("big", p): LeaderIsrAndControllerEpoch(1, 0, (1, 2), 1) for p in range(20)}
    assert client.create_partition_states(states, epoch_version) == {tp: True for tp in states}
    again = {("big", 0): states[("big", 0)]}
    assert client.create_partition_states(again, epoch_version) == {("big", 0): False}
    with pytest.raises(NoTopicError):
        client.create_partition_states({("nope", 0): states[("big", 0)]}, epoch_version)

    shrunk = LeaderIsrAndControllerEpoch(1, 0, (1,), 1)
    updates = [(tp, shrunk, 0) for tp in states]
    updates[3] = (("big", 3), LeaderIsrAndControllerEpoch(2, 1, (2,), 1), 7)  # stale version
    results = client.update_leader_and_isr_many(updates, epoch_version)
    assert results[("big", 3)] == (False, -1)
    assert all(results[tp] == (True, 1) for tp in states if tp != ("big", 3))
    assert client.get_partition_states(states)[("big", 5)] == LeaderIsrAndControllerEpoch(
        1, 0, (1,), 1, 1)

    with pytest.raises(ControllerMovedError):
        client.update_leader_and_isr_many([(("big", 0), shrunk, 1)], epoch_version + 1)
    with pytest.raises(ControllerMovedError):
        client.create_partition_states({("big", 0): shrunk}, epoch_version + 1)


def test_batched_writes_read_back_the_lost_compare_and_sets(
        make_client: Callable[..., KafkaZkClient]) -> None:
    # A write whose version is stale but whose znode already holds exactly that state is our
    # own earlier write (Kafka's checkLeaderAndIsrZkData); any other lost one failed.
    client = make_client()
    _, _, epoch_version = client.try_elect_controller(1)
    client.create_topic("cas", {p: [1, 2] for p in range(4)})
    states = {("cas", p): LeaderIsrAndControllerEpoch(1, 0, (1, 2), 1) for p in range(4)}
    client.create_partition_states(states, epoch_version)
    shrunk = LeaderIsrAndControllerEpoch(1, 1, (1,), 1)
    assert client.update_leader_and_isr_many([(("cas", 0), shrunk, 0)], epoch_version) == {
        ("cas", 0): (True, 1)}
    other = LeaderIsrAndControllerEpoch(2, 1, (2,), 1)
    results = client.update_leader_and_isr_many(
        [(("cas", 0), shrunk, 0), (("cas", 1), other, 5), (("cas", 2), shrunk, 0)], epoch_version)
    assert results == {("cas", 0): (True, 1), ("cas", 1): (False, -1), ("cas", 2): (True, 1)}

    # more builds than one multi holds: each chunk commits whole, or is replayed one by one
    client.create_topic("wide", {p: [1, 2] for p in range(250)})
    wide = {("wide", p): LeaderIsrAndControllerEpoch(1, 0, (1, 2), 1) for p in range(250)}
    assert client.create_partition_states(wide, epoch_version) == {tp: True for tp in wide}
    updates = [(tp, shrunk, 0 if tp != ("wide", 150) else 9) for tp in wide]
    results = client.update_leader_and_isr_many(updates, epoch_version)
    assert results.pop(("wide", 150)) == (False, -1)
    assert set(results.values()) == {(True, 1)} and len(results) == 249
    read = client.get_partition_states([("cas", 0), ("cas", 3), ("cas", 9)])
    assert sorted(read) == [("cas", 0), ("cas", 3)]  # no znode for partition 9
    assert read[("cas", 0)] == LeaderIsrAndControllerEpoch(1, 1, (1,), 1, 1)


def test_a_new_topics_partition_znodes_are_created_a_multi_per_hundred_not_one_request_each(
        make_client: Callable[..., KafkaZkClient], monkeypatch: pytest.MonkeyPatch) -> None:
    # One request per /partitions/<p> znode cost a turn of kazoo's connection loop each: most
    # of the controller's ZooKeeper work when a topic of thousands of partitions is created.
    client = make_client()
    _, _, epoch_version = client.try_elect_controller(1)
    client.create_topic("many", {p: [1, 2] for p in range(250)})
    singles: list[str] = []
    create_async = client.kazoo.create_async

    def counting(path: str, *args: Any, **kwargs: Any) -> Any:
        singles.append(path)
        return create_async(path, *args, **kwargs)

    monkeypatch.setattr(client.kazoo, "create_async", counting)
    states = {("many", p): LeaderIsrAndControllerEpoch(1, 0, (1, 2), 1) for p in range(250)}
    assert client.create_partition_states(states, epoch_version) == {tp: True for tp in states}
    assert singles == []
    assert len(client.get_partition_states(states)) == 250
    # a multi holding a znode that exists is redone one create each; a missing topic still
    # answers NoTopicError
    client.create_topic("some", {p: [1, 2] for p in range(3)})
    client.kazoo.create("/brokers/topics/some/partitions", b"")
    client.kazoo.create("/brokers/topics/some/partitions/1", b"")
    singles.clear()
    some = {("some", p): LeaderIsrAndControllerEpoch(1, 0, (1, 2), 1) for p in range(3)}
    assert client.create_partition_states(some, epoch_version) == {tp: True for tp in some}
    assert sorted(singles) == ["/brokers/topics/some/partitions",
                               *(f"/brokers/topics/some/partitions/{p}" for p in range(3))]
    with pytest.raises(NoTopicError):
        client.create_partition_states({("nope", 0): states[("many", 0)]}, epoch_version)


def test_log_dir_events_are_read_pipelined_in_order_skipping_deleted_ones(
        make_client: Callable[..., KafkaZkClient], monkeypatch: pytest.MonkeyPatch) -> None:
    client = make_client()
    seqs = [log_dir_event_sequence_number(client.propagate_log_dir_event(b)) for b in (3, 1, 2)]
    client.delete_log_dir_event_notifications([seqs[1]])
    waits: list[str] = []
    retry = client._retry
    monkeypatch.setattr(client, "_retry", lambda f, *a, **k: waits.append(a[0]) or retry(f, *a, **k))
    assert client.get_broker_ids_from_log_dir_events(seqs) == [3, 2]
    assert waits == []


def _sent_requests(client: KazooClient, monkeypatch: pytest.MonkeyPatch,
                   multi_read_error: Callable[[], Exception | None] = lambda: None) -> list[str]:
    """The kinds of request the client sends from now on; a multiRead is answered with
    `multi_read_error()` instead of ZooKeeper's answer when that is not None."""
    sent: list[str] = []
    call = client._call

    def record(request: Any, result: Any) -> Any:
        sent.append(type(request).__name__)
        error = multi_read_error() if sent[-1] == "MultiRead" else None
        if error is None:
            return call(request, result)
        result.set_exception(error)
        return None

    monkeypatch.setattr(client, "_call", record)
    return sent


def _many_states(client: KafkaZkClient, n: int
                 ) -> dict[tuple[str, int], LeaderIsrAndControllerEpoch]:
    """Partitions many-0 .. many-(n-1) with their states: what a read of them gives."""
    client.create_topic("many", {p: [1] for p in range(n)})
    client.create_partition_states(
        {("many", p): LeaderIsrAndControllerEpoch(1, p, (1,), 1) for p in range(n)})
    return {("many", p): LeaderIsrAndControllerEpoch(1, p, (1,), 1, 0) for p in range(n)}


def test_partition_states_are_read_a_hundred_to_a_multi_read(
        make_client: Callable[..., KafkaZkClient], monkeypatch: pytest.MonkeyPatch) -> None:
    client = make_client()
    expected = _many_states(client, 250)
    sent = _sent_requests(client.kazoo, monkeypatch)
    assert client.get_partition_states([*expected, ("many", 250)]) == expected  # (no 250)
    assert sent == ["MultiRead"] * 3


def test_a_zookeeper_without_multi_read_is_read_one_znode_a_request(
        make_client: Callable[..., KafkaZkClient], monkeypatch: pytest.MonkeyPatch) -> None:
    client = make_client()
    expected = _many_states(client, 3)
    sent = _sent_requests(client.kazoo, monkeypatch, UnimplementedError)  # before 3.6
    assert client.get_partition_states(expected) == expected
    assert sent == ["MultiRead", "GetData", "GetData", "GetData"]
    sent.clear()
    assert client.get_partition_states(expected) == expected
    assert sent == ["GetData", "GetData", "GetData"]  # not asked again


def test_a_multi_read_lost_to_the_connection_is_read_again_one_znode_at_a_time(
        make_client: Callable[..., KafkaZkClient], monkeypatch: pytest.MonkeyPatch) -> None:
    client = make_client()
    expected = _many_states(client, 150)
    lost = [ConnectionLoss()]  # the first multiRead's answer only
    sent = _sent_requests(client.kazoo, monkeypatch, lambda: lost.pop() if lost else None)
    assert client.get_partition_states(expected) == expected
    assert sent == ["MultiRead", "MultiRead"] + ["GetData"] * 100
    sent.clear()
    assert client.get_partition_states(expected) == expected
    assert sent == ["MultiRead", "MultiRead"]
