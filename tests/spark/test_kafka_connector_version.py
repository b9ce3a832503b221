"""Which spark-sql-kafka-0-10 release goes with the installed pyspark."""

from __future__ import annotations

import pytest

from tidelog.spark.kafka_connector import ConnectorUnavailable, choose_version

PUBLISHED = ["3.5.1", "4.0.0", "4.1.3", "4.2.0-preview5", "4.2.0", "4.2.0-preview1"]


def test_the_same_version_when_maven_central_has_it() -> None:
    assert choose_version("4.1.3", PUBLISHED) == "4.1.3"


def test_else_the_newest_earlier_release_of_the_same_major_version() -> None:
    assert choose_version("4.3.0", PUBLISHED) == "4.2.0"  # not a preview
    assert choose_version("4.1.4", PUBLISHED) == "4.1.3"


def test_no_release_of_that_major_version_is_an_error() -> None:
    with pytest.raises(ConnectorUnavailable, match="Spark 5.x"):
        choose_version("5.0.0", PUBLISHED)
    with pytest.raises(ConnectorUnavailable, match="not a release"):
        choose_version("4.3.0-preview1", PUBLISHED)
