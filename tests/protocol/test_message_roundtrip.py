"""Every generated message, in every version, survives encode -> decode -> encode unchanged."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_schema import api_messages, message_strategy, messages_with_classes

CASES = [
    pytest.param(modname, msg.kind, v, id=f"{modname}-{msg.kind}-v{v}")
    for modname, msg in api_messages()
    for v in msg.versions
]


@pytest.mark.parametrize(("modname", "kind", "version"), CASES)
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_messages_round_trip(
    modname: str, kind: str, version: int, data: st.DataObject
) -> None:
    module = importlib.import_module(f"tidelog.protocol.messages.{modname}")
    msg, classes = next((m, c) for m, c in messages_with_classes(modname) if m.kind == kind)
    encode = getattr(module, f"encode_{kind}")
    decode = getattr(module, f"decode_{kind}")
    message = data.draw(message_strategy(msg, classes, version), label="message")
    wire = b"".join(encode(version, message))
    decoded, end = decode(version, wire)
    assert end == len(wire)
    assert decoded == message
    assert b"".join(encode(version, decoded)) == wire
