"""ApiVersions as Kafka 3.9 and tidelog advertise them, where the difference is documented."""

from __future__ import annotations

import pytest
from differential import Pair, Target, raw
from known_differences import DIFFERENCES

from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.messages.api_versions import ApiVersionsRequest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_fetch_v0_to_v3_are_not_served(pair: Pair) -> None:
    assert "fetch v0-3" in DIFFERENCES

    def fetch_versions(t: Target) -> tuple[int, int]:
        r = raw(t.bootstrap.split(",")[0], ApiVersionsRequest(
            client_software_name="compat", client_software_version="1"), 3)
        return next((k.min_version, k.max_version) for k in r.api_keys
                    if k.api_key == ApiKey.FETCH)

    on_kafka, on_tidelog = pair.run(fetch_versions)
    assert on_kafka[0] == 0 and on_tidelog[0] == 4
