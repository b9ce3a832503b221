"""Every generated message, in every version, survives encode -> decode -> encode unchanged."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_schema import api_messages, message_strategy, messages_with_classes

CASES = [
    pytest.param(modname, msg.kind, id=f"{modname}-{msg.kind}") for modname, msg in api_messages()
]


@pytest.mark.parametrize(("modname", "kind"), CASES)
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_messages_round_trip_in_every_version(
    modname: str, kind: str, data: st.DataObject
) -> None:
    module = importlib.import_module(f"tidelog.protocol.messages.{modname}")
    msg, classes = next((m, c) for m, c in messages_with_classes(modname) if m.kind == kind)
    encode = getattr(module, f"encode_{kind}")
    decode = getattr(module, f"decode_{kind}")
    for version in msg.versions:  # each example covers every version once
        message = data.draw(message_strategy(msg, classes, version), label=f"v{version}")
        wire = b"".join(encode(version, message))
        decoded, end = decode(version, wire)
        assert end == len(wire)
        assert decoded == message, f"v{version}"
        assert b"".join(encode(version, decoded)) == wire, f"v{version}"
