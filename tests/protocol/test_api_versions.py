"""The ApiVersions table tidelog advertises."""

from __future__ import annotations

from tidelog.protocol.api_keys import ApiKey, api_spec
from tidelog.protocol.api_versions import (
    BROKER_API_VERSIONS,
    advertised,
    api_versions_response,
    is_supported,
)


def test_non_flexible_versions_that_aiokafka_and_librdkafka_use_are_served() -> None:
    for key, version in [
        (ApiKey.FIND_COORDINATOR, 2),
        (ApiKey.JOIN_GROUP, 5),
        (ApiKey.SYNC_GROUP, 3),
        (ApiKey.HEARTBEAT, 3),
        (ApiKey.LEAVE_GROUP, 1),
        (ApiKey.CREATE_TOPICS, 4),
    ]:
        lo, hi = BROKER_API_VERSIONS[key]
        assert lo <= version <= hi
        assert not api_spec(key).is_flexible(version)
        assert is_supported(key, version)


def test_produce_is_advertised_from_v0_but_v0_to_v2_are_refused() -> None:
    assert BROKER_API_VERSIONS[ApiKey.PRODUCE][0] == 0
    assert [is_supported(ApiKey.PRODUCE, v) for v in range(5)] == [False, False, False, True, True]


def test_clients_probing_api_versions_v3_and_v4_get_an_answer() -> None:
    assert BROKER_API_VERSIONS[ApiKey.API_VERSIONS] == (0, 4)


def test_every_advertised_range_lies_within_the_generated_codecs() -> None:
    for key, (lo, hi) in advertised().items():
        spec = api_spec(key)
        assert spec.min_version <= lo <= hi <= spec.max_version


def test_response_lists_every_advertised_api_once() -> None:
    keys = [entry.api_key for entry in api_versions_response().api_keys]
    assert keys == sorted(set(keys)) == sorted(advertised())
    client_only = [e.api_key for e in api_versions_response(include_controller_apis=False).api_keys]
    assert ApiKey.LEADER_AND_ISR not in client_only and ApiKey.FETCH in client_only
