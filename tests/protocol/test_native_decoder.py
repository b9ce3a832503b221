"""The native (C) decoders give exactly what the pure-Python decoders give: equal messages with
the same field types, the same end position, and a DecodeError for the same malformed inputs.

Every generated module has both: ``decode_*`` / ``*_DECODERS`` (native when
tidelog.protocol._native_decoder is built) and ``py_decode_*`` / ``PY_*_DECODERS``.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_schema import api_messages, message_strategy, messages_with_classes
from test_captured_traffic import CLIENTS, requests_of, responses_of
from test_decoder_fuzz import SEEDS

from tidelog.protocol.api_keys import all_specs, api_spec
from tidelog.protocol.errors import DecodeError
from tidelog.protocol.headers import peek_api
from tidelog.protocol.messages import fetch, produce
from tidelog.protocol.messages import request_header as rqh
from tidelog.protocol.messages import response_header as rsh

PURE = os.environ.get("TIDELOG_PURE_PYTHON") == "1"
native_only = pytest.mark.skipif(PURE, reason="TIDELOG_PURE_PYTHON=1: native decoders disabled")

CASES = [
    pytest.param(modname, msg.kind, id=f"{modname}-{msg.kind}") for modname, msg in api_messages()
]


def same(a: Any, b: Any, path: str = "") -> None:
    """a and b are equal and of the same types all the way down (== alone would let a bytes
    equal a memoryview, or a list equal a tuple)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, tuple):  # unknown tagged fields: (tag, bytes)
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, memoryview):
        # records: a view of the input, as the Python decoder's
        assert a.obj is b.obj, path
        assert (a.format, a.readonly, a.ndim, a.nbytes) == (b.format, b.readonly, b.ndim, b.nbytes)
        assert a.tobytes() == b.tobytes(), path
    elif isinstance(a, float) and a != a:
        assert b != b, path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def both(native: Any, python: Any, *args: Any) -> tuple[Any, Any]:
    """Run both decoders; both raise DecodeError (-> None, None) or both return."""
    results = []
    for fn in (native, python):
        try:
            results.append(fn(*args))
        except DecodeError:
            results.append(None)
    n, p = results
    assert (n is None) == (p is None), f"native {n!r} vs python {p!r}"
    if n is not None:
        same(n, p)
    return n, p


@native_only
def test_the_extension_is_built_and_used() -> None:
    from tidelog.protocol import _native_decoder

    assert _native_decoder.FAST_SLICE  # record slices without slice objects
    assert _native_decoder.FAST_MBUF  # and, for bytes input, without memoryview(input)
    for module in (produce, fetch, rqh, rsh):
        assert module.NATIVE
    assert produce.decode_request is not produce.py_decode_request
    assert type(produce.REQUEST_DECODERS[9]).__name__ == "Program"
    assert produce.PY_REQUEST_DECODERS[9].__module__ == produce.__name__
    for spec in all_specs():
        module = spec.module
        assert module.NATIVE and module.REQUEST_DECODERS is not module.PY_REQUEST_DECODERS


def test_pure_python_env_disables_the_native_decoders() -> None:
    code = (
        "from tidelog.protocol.messages import produce as p; "
        "assert not p.NATIVE and p.decode_request is p.py_decode_request "
        "and p.REQUEST_DECODERS is p.PY_REQUEST_DECODERS"
    )
    env = dict(os.environ, TIDELOG_PURE_PYTHON="1")
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


@pytest.mark.parametrize(("modname", "kind"), CASES)
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_messages_decode_the_same_natively(
    modname: str, kind: str, data: st.DataObject
) -> None:
    module = importlib.import_module(f"tidelog.protocol.messages.{modname}")
    msg, classes = next((m, c) for m, c in messages_with_classes(modname) if m.kind == kind)
    encode = getattr(module, f"encode_{kind}")
    native = getattr(module, f"decode_{kind}")
    python = getattr(module, f"py_decode_{kind}")
    for version in msg.versions:
        message = data.draw(message_strategy(msg, classes, version), label=f"v{version}")
        wire = b"".join(encode(version, message))
        decoded, end = both(native, python, version, wire)[0]
        assert end == len(wire) and decoded == message, f"v{version}"
        # at an offset, in other buffer types, and cut short
        prefix = data.draw(st.binary(max_size=3), label="prefix")
        framed = prefix + wire + b"\x00\x01"
        both(native, python, version, framed, len(prefix))
        both(native, python, version, memoryview(framed), len(prefix))
        both(native, python, version, bytearray(framed), len(prefix))
        if wire:
            cut = data.draw(st.integers(0, len(wire) - 1), label="cut")
            both(native, python, version, wire[:cut])
        # the per-version tables (what codec.py calls) agree too
        tables = (
            getattr(module, f"{kind.upper()}_DECODERS"),
            getattr(module, f"PY_{kind.upper()}_DECODERS"),
        )
        view = memoryview(framed)
        out = []
        for table in tables:
            try:
                out.append(table[version](view, len(prefix), len(view)))
            except (DecodeError, struct.error, IndexError, ValueError):
                out.append(None)
        same(out[0], out[1])


@pytest.mark.parametrize(("modname", "kind"), CASES)
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_messages_fail_or_succeed_alike(
    modname: str, kind: str, data: st.DataObject
) -> None:
    module = importlib.import_module(f"tidelog.protocol.messages.{modname}")
    msg, classes = next((m, c) for m, c in messages_with_classes(modname) if m.kind == kind)
    version = data.draw(st.sampled_from(msg.versions), label="version")
    message = data.draw(message_strategy(msg, classes, version), label="message")
    wire = bytearray(b"".join(getattr(module, f"encode_{kind}")(version, message)))
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        op = data.draw(st.sampled_from(["flip", "truncate", "insert", "big", "varint"]))
        pos = data.draw(st.integers(0, max(len(wire) - 1, 0)))
        if op == "flip" and wire:
            wire[pos] = data.draw(st.integers(0, 255))
        elif op == "truncate":
            del wire[pos:]
        elif op == "insert":
            wire[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif op == "big":
            wire[pos : pos + 4] = data.draw(
                st.sampled_from([b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe", b"\xff\xff\xff\x0f"])
            )
        else:  # long and overlong varints (counts, lengths, tags)
            wire[pos:pos] = data.draw(
                st.sampled_from(
                    [
                        b"\x80\x01",
                        b"\xff\xff\xff\xff\x0f",
                        b"\xff\xff\xff\xff\x7f",
                        b"\x80\x80\x80\x80\x80\x01",
                        b"\x00",
                    ]
                )
            )
    both(
        getattr(module, f"decode_{kind}"),
        getattr(module, f"py_decode_{kind}"),
        version,
        bytes(wire),
    )


KEYS_VERSIONS = [
    (s.api_key, v, kind)
    for s in all_specs()
    for v in range(s.min_version, s.max_version + 1)
    for kind in ("request", "response")
]


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(key_version=st.sampled_from(KEYS_VERSIONS), body=st.binary(max_size=120))
def test_random_bodies_fail_or_succeed_alike(
    key_version: tuple[int, int, str], body: bytes
) -> None:
    key, version, kind = key_version
    module = api_spec(key).module
    native, python = getattr(module, f"decode_{kind}"), getattr(module, f"py_decode_{kind}")
    both(native, python, version, body)
    both(native, python, version, b"\x00" + body)  # an empty tagged section / null first


def decode_frame(frame: bytes, native: bool) -> tuple[Any, Any] | None:
    """codec.decode_request's work on one path (native tables or Python tables)."""
    view = memoryview(frame)
    try:
        api_key, api_version, _ = peek_api(view)
        spec = api_spec(api_key)
    except DecodeError:
        return None
    if not spec.min_version <= api_version <= spec.max_version:
        return None
    headers = rqh.HEADER_DECODERS if native else rqh.PY_HEADER_DECODERS
    bodies = spec.module.REQUEST_DECODERS if native else spec.module.PY_REQUEST_DECODERS
    n = len(view)
    try:
        header, pos = headers[spec.request_header_version(api_version)](view, 0, n)
        return header, bodies[api_version](view, pos, n)
    except DecodeError:
        return None
    except (struct.error, IndexError, UnicodeDecodeError, ValueError):
        if native and rqh.NATIVE:
            raise  # the native decoders raise DecodeError only
        return None


def frames_alike(frame: bytes) -> None:
    same(decode_frame(frame, True), decode_frame(frame, False))


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_request_frames_fail_or_succeed_alike(data: st.DataObject) -> None:
    frame = bytearray(data.draw(st.sampled_from(SEEDS), label="seed"))
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        kind = data.draw(st.sampled_from(["flip", "truncate", "insert", "big"]))
        pos = data.draw(st.integers(0, max(len(frame) - 1, 0)))
        if kind == "flip" and frame:
            frame[pos] = data.draw(st.integers(0, 255))
        elif kind == "truncate":
            del frame[pos:]
        elif kind == "insert":
            frame[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            frame[pos : pos + 4] = data.draw(
                st.sampled_from([b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe", b"\xff\xff\xff\x0f"])
            )
    frames_alike(bytes(frame))


@settings(max_examples=300, deadline=None)
@given(frame=st.binary(max_size=300))
def test_random_request_frames_fail_or_succeed_alike(frame: bytes) -> None:
    frames_alike(frame)


@pytest.mark.parametrize("client", CLIENTS)
def test_captured_traffic_decodes_the_same_natively(client: str) -> None:
    for frame in requests_of(client):
        native = decode_frame(frame, True)
        assert native is not None
        same(native, decode_frame(frame, False))
    for key, version, frame in responses_of(client):
        module = api_spec(key).module
        header_version = api_spec(key).response_header_version(version)
        h1 = rsh.decode_header(header_version, frame)
        h2 = rsh.py_decode_header(header_version, frame)
        same(h1, h2)
        same(
            module.decode_response(version, frame, h1[1]),
            module.py_decode_response(version, frame, h2[1]),
        )


def test_unknown_and_known_tagged_fields() -> None:
    # a FetchResponse v12 partition with a known tag (1: current leader), two unknown ones
    part = fetch.PartitionData(
        partition_index=1,
        records=b"abc",
        current_leader=fetch.LeaderIdAndEpoch(3, 4),
        unknown_tagged_fields=[(7, b"x"), (1000, b"")],
    )
    message = fetch.FetchResponse(
        responses=[fetch.FetchableTopicResponse(topic="t", partitions=[part])]
    )
    wire = b"".join(fetch.encode_response(12, message))
    decoded, end = both(fetch.decode_response, fetch.py_decode_response, 12, wire)[0]
    assert end == len(wire)
    got = decoded.responses[0].partitions[0]
    assert got.current_leader == fetch.LeaderIdAndEpoch(3, 4)
    assert got.unknown_tagged_fields == [(7, b"x"), (1000, b"")]
    assert type(got.records) is memoryview and bytes(got.records) == b"abc"


def test_absent_fields_get_fresh_mutable_defaults() -> None:
    # Fetch v0 has no node_endpoints (a list default) and partitions without tagged structs
    wire = b"".join(fetch.encode_response(0, fetch.FetchResponse(responses=[])))
    a = fetch.decode_response(0, wire)[0]
    b = fetch.decode_response(0, wire)[0]
    assert a.node_endpoints == [] and a.node_endpoints is not b.node_endpoints


def test_huge_counts_are_refused_before_allocating() -> None:
    frames = [
        # Metadata v1: a topic array claiming 2**31-1 entries
        (api_spec(3).module, 1, b"\x7f\xff\xff\xff"),
        # Fetch v12: a compact array claiming 2**28 topics
        (fetch, 12, struct.pack(">iiiibii", -1, 0, 0, 0, 0, 0, 0) + b"\xff\xff\xff\x7f"),
        # Produce v9: records claiming 2**34 bytes (a 5-byte varint)
        (
            produce,
            9,
            b"\x00\xff\xff\x00\x00\x00\x01\x02\x02t\x02\x00\x00\x00\x00\xff\xff\xff\xff\x7f",
        ),
    ]
    tracemalloc.start()
    try:
        for module, version, body in frames:
            for data in (body, body + bytes(64)):
                both(module.decode_request, module.py_decode_request, version, data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_version_and_argument_errors() -> None:
    with pytest.raises(DecodeError, match="not defined"):
        produce.decode_request(99, b"")
    with pytest.raises(DecodeError, match="not defined"):
        produce.decode_request(-1, b"")
    with pytest.raises(DecodeError):
        produce.decode_request(9, b"")
    wire = b"".join(produce.encode_request(9, produce.ProduceRequest()))
    assert produce.decode_request(9, b"zz" + wire, pos=2)[1] == len(wire) + 2
    # the Python twin's signature, keywords included
    for decode in (produce.decode_request, produce.py_decode_request):
        assert decode(version=9, buf=b"z" + wire, pos=1)[1] == len(wire) + 1
        with pytest.raises(TypeError):
            decode(9)


@native_only
def test_repeated_decoding_does_not_leak() -> None:
    message = produce.ProduceRequest(
        topic_data=[
            produce.TopicProduceData(
                "t", [produce.PartitionProduceData(i, b"r" * 100) for i in range(5)]
            )
        ]
    )
    wires = [b"".join(produce.encode_request(v, message)) for v in (3, 7, 9, 11)]
    bad = wires[2][:-7]

    def rounds(n: int) -> None:
        for _ in range(n):
            for v, w in zip((3, 7, 9, 11), wires, strict=True):
                produce.decode_request(v, w)
            try:
                produce.decode_request(9, bad)
            except DecodeError:
                pass

    rounds(2000)  # warm up caches and free lists
    tracemalloc.start()
    try:
        rounds(1000)
        before, _ = tracemalloc.get_traced_memory()
        rounds(5000)
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 16 * 1024


def test_generated_modules_keep_both_paths() -> None:
    # every module exposes the pure-Python twin of each native entry point
    for path in sorted((Path(produce.__file__).parent).glob("*.py")):
        if path.name.startswith("_"):
            continue
        module = importlib.import_module(f"tidelog.protocol.messages.{path.stem}")
        for role in ("request", "response", "data", "header"):
            if hasattr(module, f"decode_{role}"):
                assert hasattr(module, f"py_decode_{role}")
                assert hasattr(module, f"PY_{role.upper()}_DECODERS")
