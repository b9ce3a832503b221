"""More real-process faults on the 3-broker cluster, each during an acks=all stream:

- the controller's broker killed with -9: another broker becomes controller with a higher
  controller epoch, moves the dead broker's leaderships, and topics can still be created;
- the leader stopped with SIGTERM: a controlled shutdown moves leadership off it before it
  exits, so not one delivery fails;
- the leader, also the controller, paused with SIGSTOP past its ZooKeeper session timeout (a
  zombie): a new leader and a new controller are elected, the zombie's acknowledgements cannot
  happen (its ISR writes are fenced), and after SIGCONT it resigns as controller and comes back
  as a follower;

and in each: no acknowledged write is lost, one leader per leader epoch, and a consumer asking
for the high watermark never sees it go back.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from real_cluster_harness import RealCluster, producer, read_through_last_acked, wait_for

from tidelog.cluster.local import LocalCluster, _pid_runs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


class Stream:
    """An acks=all producer sending numbered records in a thread, plus watchers of the
    partition state (leader per epoch) and of the high watermark a consumer sees."""

    def __init__(self, real_cluster: RealCluster, topic: str) -> None:
        self.cluster = real_cluster
        self.topic = topic
        self.acked: list[tuple[int, bytes]] = []
        self.failed: list[str] = []
        self.epochs: dict[int, set[int]] = {}
        self.high_watermarks: list[int] = []
        self._stop = threading.Event()
        # A paused (zombie) broker keeps its TCP connections open: give up on it soon.
        self._producer = producer(real_cluster.bootstrap, **{
            "request.timeout.ms": 3000, "socket.timeout.ms": 4000,
            "topic.metadata.refresh.interval.ms": 1000})
        self._threads = [threading.Thread(target=f, daemon=True)
                         for f in (self._produce, self._watch_state, self._watch_hw)]

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed.append(str(err))
        else:
            self.acked.append((msg.offset(), msg.value()))

    def _produce(self) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                self._producer.produce(self.topic, value=b"v-%07d" % i,
                                       on_delivery=self._on_delivery)
                i += 1
            except BufferError:
                pass
            self._producer.poll(0.002)
        self._producer.flush(60)

    def _watch_state(self) -> None:
        while not self._stop.is_set():
            try:
                s = self.cluster.state(self.topic)
            except Exception:  # noqa: BLE001 - a ZooKeeper hiccup: read again
                s = None
            if s is not None and s.leader >= 0:
                self.epochs.setdefault(s.leader_epoch, set()).add(s.leader)
            time.sleep(0.05)

    def _watch_hw(self) -> None:
        c = confluent_kafka.Consumer({"bootstrap.servers": self.cluster.bootstrap,
                                      "group.id": f"hw-{uuid.uuid4().hex[:6]}"})
        tp = confluent_kafka.TopicPartition(self.topic, 0)
        try:
            while not self._stop.is_set():
                try:
                    _low, high = c.get_watermark_offsets(tp, timeout=2.0, cached=False)
                    if high >= 0:
                        self.high_watermarks.append(high)
                except confluent_kafka.KafkaException:
                    pass  # no leader right now: ask again
                time.sleep(0.05)
        finally:
            c.close()

    def acked_count(self) -> int:
        return len(self.acked)

    def start(self) -> Stream:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(90)

    def check(self) -> None:
        """No acked write lost, offsets hold what was acked, one leader per epoch, HW
        monotonic for consumers."""
        got = read_through_last_acked(self.cluster.bootstrap, self.topic, self.acked)
        by_offset = {o: v for _k, v, o in got}
        lost = [(o, v) for o, v in self.acked if by_offset.get(o) != v]
        assert not lost, f"{len(lost)} acknowledged records lost or replaced, e.g. {lost[:3]}"
        assert [o for _k, _v, o in got] == list(range(len(got)))
        assert all(len(leaders) == 1 for leaders in self.epochs.values()), self.epochs
        hws = self.high_watermarks
        back = [(a, b) for a, b in zip(hws, hws[1:], strict=False) if b < a]
        assert not back, f"a consumer saw the high watermark go back: {back[:3]}"


@contextmanager
def streaming(real_cluster: RealCluster, topic: str, create: bool = True) -> Iterator[Stream]:
    if create:
        real_cluster.create_topic(topic)
    s = Stream(real_cluster, topic).start()
    try:
        wait_for(lambda: s.acked_count() >= 200, 60, "a first 200 acked records")
        yield s
    finally:
        s.stop()


def produce_more(s: Stream, n: int, timeout_s: float = 90) -> None:
    target = s.acked_count() + n
    wait_for(lambda: s.acked_count() >= target, timeout_s,
             f"{n} more acked records (errors: {s.failed[:2]})")


def local(real_cluster: RealCluster) -> LocalCluster:
    return LocalCluster.load(real_cluster.dir)


def test_controller_kill9_moves_the_role_and_its_leaderships(real_cluster: RealCluster) -> None:
    zk = real_cluster.zk
    controller = zk.get_controller_id()
    epoch_before = zk.get_controller_epoch()
    assert controller is not None and epoch_before is not None
    topic = "ctl-kill"
    # Its preferred leader is the controller's broker.
    others = sorted({1, 2, 3} - {controller})
    real_cluster.create_topic_with_assignment(topic, {0: [controller, *others]})
    with streaming(real_cluster, topic, create=False) as s:
        real_cluster.kill(controller)
        new_controller = wait_for(
            lambda: (c := zk.get_controller_id()) is not None and c != controller and c,
            60, "a new controller")
        epoch_after = zk.get_controller_epoch()
        assert epoch_after is not None and epoch_after[0] > epoch_before[0]
        st = wait_for(lambda: (x := real_cluster.state(topic)) and x.leader in others and x,
                      60, "the dead controller's leadership moved")
        assert st.controller_epoch == epoch_after[0]
        produce_more(s, 200)
        # The new controller serves admin requests: create a topic and use it.
        real_cluster.create_topic("after-ctl-kill", rf=2)  # two brokers are left
        assert new_controller in others
    s.check()
    real_cluster.start(controller)
    wait_for(lambda: (x := real_cluster.state(topic)) and controller in x.isr, 60,
             "the old controller's broker back in the ISR")


def test_leader_sigterm_is_a_controlled_shutdown(real_cluster: RealCluster) -> None:
    topic = "sigterm"
    with streaming(real_cluster, topic) as s:
        before = real_cluster.state(topic)
        assert before is not None
        leader = before.leader
        log = Path(local(real_cluster).brokers[leader].log_file)
        real_cluster.stop(leader)  # SIGTERM; returns once the process exited
        after = real_cluster.state(topic)
        assert after is not None and after.leader not in (leader, -1)
        assert leader not in after.isr
        assert f"controlled shutdown of broker {leader} succeeded" in log.read_text()
        produce_more(s, 200)
    assert not s.failed, s.failed[:3]
    s.check()
    real_cluster.start(leader)
    wait_for(lambda: (x := real_cluster.state(topic)) and leader in x.isr, 60,
             "the stopped leader back in the ISR")


def test_zombie_leader_and_controller_paused_past_session_timeout(
        real_cluster: RealCluster) -> None:
    zk = real_cluster.zk
    controller = zk.get_controller_id()
    assert controller is not None
    topic = "zombie"
    # The zombie leads the partition and is the controller: both roles must be fenced.
    others = sorted({1, 2, 3} - {controller})
    real_cluster.create_topic_with_assignment(topic, {0: [controller, *others]})
    paused: int | None = None
    try:
        with streaming(real_cluster, topic, create=False) as s:
            before = real_cluster.state(topic)
            assert before is not None and before.leader == controller
            b = local(real_cluster).brokers[controller]
            assert b.pid is not None and _pid_runs(b.pid, b.config)
            log = Path(b.log_file)
            os.kill(b.pid, signal.SIGSTOP)
            paused = b.pid
            new = wait_for(lambda: (x := real_cluster.state(topic)) and x.leader not in
                           (controller, -1) and x, 60, "a new leader while the old one is paused")
            assert new.leader_epoch > before.leader_epoch
            new_controller = zk.get_controller_id()
            assert new_controller in others
            produce_more(s, 200)
            os.kill(b.pid, signal.SIGCONT)
            paused = None
            # Back from the dead: a new session, a new broker epoch; a follower, and no longer
            # the controller (it resigned when it learnt its session had expired).
            wait_for(lambda: (x := real_cluster.state(topic)) and controller in x.isr
                     and x.leader != controller, 90, "the zombie back in the ISR as a follower")
            wait_for(lambda: f"controller {controller}: resigning" in log.read_text(), 30,
                     "the zombie controller resigning")
            assert zk.get_controller_id() == new_controller
            produce_more(s, 100)
    finally:
        if paused is not None:
            os.kill(paused, signal.SIGCONT)
    s.check()
