"""Which spark-sql-kafka-0-10 revisions are asked of Spark's resolver for a pyspark version."""

from __future__ import annotations

import pytest

from tidelog.spark.kafka_connector import ConnectorUnavailable, candidate_versions


def test_the_installed_pyspark_version_is_asked_for_first() -> None:
    assert candidate_versions("4.1.3")[0] == "4.1.3"


def test_then_the_newest_patch_of_its_minor_and_each_earlier_minor_of_the_same_major() -> None:
    assert candidate_versions("4.3.0") == ["4.3.0", "4.3.+", "4.2.+", "4.1.+", "4.0.+"]
    assert candidate_versions("4.0.1") == ["4.0.1", "4.0.+"]


def test_a_pyspark_that_is_no_release_is_an_error() -> None:
    with pytest.raises(ConnectorUnavailable):
        candidate_versions("4.3.0-preview1")
