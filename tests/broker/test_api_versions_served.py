"""The broker advertises exactly what it serves (issue 11 item 3): every API in its ApiVersions
answer has a handler, every handler's API is advertised, and a request at every advertised
version gets an answer of its API (never a closed connection)."""

from __future__ import annotations

import asyncio

import pytest
from harness import BrokerThread

from tidelog.client.connection import BrokerConnection
from tidelog.protocol.api_keys import ApiKey, api_spec
from tidelog.protocol.messages.api_versions import ApiVersionsRequest

pytestmark = pytest.mark.integration


def _advertised(port: int) -> dict[int, tuple[int, int]]:
    async def ask() -> dict[int, tuple[int, int]]:
        conn = BrokerConnection("127.0.0.1", port, request_timeout_ms=5000)
        try:
            await conn.connect(timeout_s=5)
            resp = await conn.send(ApiVersionsRequest(), 0)
            return {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        finally:
            await conn.close()

    return asyncio.run(ask())


def test_every_advertised_api_has_a_handler_and_every_handler_is_advertised(
        one_broker: BrokerThread) -> None:
    advertised = _advertised(one_broker.port)
    handled = set(one_broker.call(lambda: dict(one_broker.server.apis.handlers)))
    names = {k: api_spec(k).name for k in advertised.keys() ^ handled}
    assert advertised.keys() == handled, names


def test_every_advertised_version_is_answered(one_broker: BrokerThread) -> None:
    """An empty request of each API at each version: the answer may be an error (nothing is
    in it), but it is an answer of that API, on a connection that stays open."""
    advertised = _advertised(one_broker.port)

    async def connect() -> BrokerConnection:
        conn = BrokerConnection("127.0.0.1", one_broker.port, request_timeout_ms=5000)
        await conn.connect(timeout_s=5)
        return conn

    async def walk() -> list[str]:
        failures: list[str] = []
        conn = await connect()
        try:
            for key, (lo, hi) in sorted(advertised.items()):
                spec = api_spec(key)
                for version in range(lo, hi + 1):
                    request = spec.request_class()
                    if key == ApiKey.PRODUCE:
                        request.acks = 1  # acks=0 is answered by silence, as Kafka does
                    try:
                        resp = await conn.send(request, version, timeout_ms=5000)
                    except Exception as e:  # noqa: BLE001 - record and reconnect
                        failures.append(f"{spec.name} v{version}: {type(e).__name__}: {e}")
                        await conn.close()
                        conn = await connect()
                        continue
                    if not isinstance(resp, spec.response_class):
                        failures.append(f"{spec.name} v{version}: got {type(resp).__name__}")
        finally:
            await conn.close()
        return failures

    assert asyncio.run(walk()) == []
