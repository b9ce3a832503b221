"""The stream reader's offset logic (latestOffset, limits, availableNow, planning) against a
scripted cluster view: which offsets a micro-batch gets, without Spark."""

from __future__ import annotations

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from tidelog.client.metadata import TopicPartition
from tidelog.spark.arrow import source_schema
from tidelog.spark.options import parse_source_options
from tidelog.spark.reader import OffsetRange
from tidelog.spark.stream_reader import TidelogStreamReader

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


class ClusterView:
    """What SyncKafka would answer: the subscribed partitions, log starts and HWs."""

    def __init__(self, earliest: dict, latest: dict) -> None:
        self.earliest = earliest
        self.latest = latest

    def topic_partitions(self, subscription) -> list[TopicPartition]:
        return sorted(tp for tp in self.latest if subscription.matches(tp.topic))

    def earliest_offsets(self, tps, **_: int) -> dict:
        return {tp: self.earliest[tp] for tp in tps}

    def latest_offsets(self, tps, **_: int) -> dict:
        return {tp: self.latest[tp] for tp in tps}


def _reader(view: ClusterView, **extra: str) -> TidelogStreamReader:
    options = parse_source_options(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribePattern": "a|b", **extra},
        streaming=True,
    )
    reader = TidelogStreamReader(options, source_schema())
    reader._kafka = view  # type: ignore[assignment]
    return reader


def test_initial_offsets_and_the_default_limit() -> None:
    view = ClusterView({A0: 2, A1: 0}, {A0: 10, A1: 4})
    assert _reader(view).initialOffset() == {"a": {"0": 10, "1": 4}}
    assert _reader(view, startingOffsets="earliest").initialOffset() == {"a": {"0": 2, "1": 0}}
    assert isinstance(_reader(view).getDefaultReadLimit(), ReadAllAvailable)
    assert _reader(view, maxOffsetsPerTrigger="7").getDefaultReadLimit() == ReadMaxRows(7)
    assert _reader(view, minOffsetsPerTrigger="3").getDefaultReadLimit() == ReadMinRows(3)


def test_max_rows_splits_the_backlog_and_new_partitions_start_at_earliest() -> None:
    view = ClusterView({A0: 0, A1: 0, B0: 0}, {A0: 100, A1: 10, B0: 10})
    reader = _reader(view, maxOffsetsPerTrigger="12")
    start = {"a": {"0": 0, "1": 0}}  # b-0 appeared since
    end = reader.latestOffset(start, ReadMaxRows(12))
    assert end == {"a": {"0": 10, "1": 1}, "b": {"0": 1}}
    assert reader.latestOffset(start, ReadAllAvailable()) == {
        "a": {"0": 100, "1": 10},
        "b": {"0": 10},
    }
    ranges = reader.partitions(start, end)
    assert list(ranges) == [
        OffsetRange("a", 0, 0, 10),
        OffsetRange("a", 1, 0, 1),
        OffsetRange("b", 0, 0, 1),
    ]


def test_min_rows_holds_the_batch_until_enough_arrived_or_the_delay_passed() -> None:
    view = ClusterView({A0: 0}, {A0: 3})
    reader = _reader(view, minOffsetsPerTrigger="5", maxTriggerDelay="1h")
    start = {"a": {"0": 0}}
    assert reader.latestOffset(start, ReadMinRows(5)) == start  # 3 < 5: no batch yet
    view.latest[A0] = 6
    assert reader.latestOffset(start, ReadMinRows(5)) == {"a": {"0": 6}}
    # With the delay passed, a smaller backlog goes anyway.
    reader = _reader(view, minOffsetsPerTrigger="50", maxTriggerDelay="0ms")
    assert reader.latestOffset(start, ReadMinRows(50)) == {"a": {"0": 6}}


def test_available_now_stops_at_the_offsets_of_its_start() -> None:
    view = ClusterView({A0: 0}, {A0: 8})
    reader = _reader(view, maxOffsetsPerTrigger="5", minOffsetsPerTrigger="5")
    reader.prepareForTriggerAvailableNow()
    view.latest[A0] = 100  # arrives after the query started: not part of this run
    first = reader.latestOffset({"a": {"0": 0}}, ReadMaxRows(5))
    assert first == {"a": {"0": 5}}
    second = reader.latestOffset(first, ReadMaxRows(5))
    assert second == {"a": {"0": 8}}  # 3 < minOffsetsPerTrigger, yet it goes: the run must end
    assert reader.latestOffset(second, ReadMaxRows(5)) == second


def test_the_reader_pickles_without_its_client() -> None:
    import pickle

    reader = _reader(ClusterView({A0: 0}, {A0: 1}))
    clone = pickle.loads(pickle.dumps(reader))
    assert clone._kafka is None and clone.options == reader.options
