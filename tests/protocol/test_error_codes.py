"""ErrorCode carries Kafka's numbers, names and retriable flags."""

from __future__ import annotations

import pytest

from tidelog.protocol.errors import DecodeError, ErrorCode, error_name


def test_well_known_codes() -> None:
    assert ErrorCode.NONE == 0 and not ErrorCode.NONE.retriable
    assert ErrorCode.OFFSET_OUT_OF_RANGE == 1 and not ErrorCode.OFFSET_OUT_OF_RANGE.retriable
    assert ErrorCode.NOT_LEADER_OR_FOLLOWER == 6 and ErrorCode.NOT_LEADER_OR_FOLLOWER.retriable
    assert ErrorCode.UNSUPPORTED_VERSION == 35
    assert ErrorCode.NOT_ENOUGH_REPLICAS == 19 and ErrorCode.NOT_ENOUGH_REPLICAS.retriable
    assert ErrorCode.FENCED_LEADER_EPOCH == 74 and ErrorCode.FENCED_LEADER_EPOCH.retriable
    assert ErrorCode.UNKNOWN_SERVER_ERROR == -1
    assert ErrorCode(16).name == "NOT_COORDINATOR"
    assert "coordinator" in ErrorCode.NOT_COORDINATOR.message


def test_unknown_codes_have_a_printable_name() -> None:
    assert error_name(3) == "UNKNOWN_TOPIC_OR_PARTITION"
    assert error_name(31000) == "UNKNOWN(31000)"
    with pytest.raises(ValueError):
        ErrorCode(31000)


def test_decode_error_is_a_value_error() -> None:
    assert issubclass(DecodeError, ValueError)


def test_table_agrees_with_kio() -> None:
    kio_errors = pytest.importorskip("kio.schema.errors")
    theirs = {int(e.value): (e.name.upper(), e.retriable) for e in kio_errors.ErrorCode}
    ours = {int(e): (e.name, e.retriable) for e in ErrorCode}
    assert ours == theirs
