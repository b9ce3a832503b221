"""Cross-check against kio (an independent implementation of Kafka's schemas): for every API and
version both cover, random messages encoded by tidelog decode in kio to the same values, and
kio's encoding of them decodes in tidelog to the original message."""

from __future__ import annotations

import datetime
import enum
import importlib
import io
import types
import typing
import uuid
from dataclasses import fields, is_dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from protocol_schema import api_messages, message_strategy, messages_with_classes

kio_index = pytest.importorskip("kio.index")
from kio.schema.index import schema_name_map  # noqa: E402
from kio.serial import entity_reader, entity_writer  # noqa: E402
from kio.static.constants import EntityType  # noqa: E402

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_ZERO_UUID = uuid.UUID(int=0)


def kio_class(modname: str, msg: Any, version: int) -> type | None:
    kind = EntityType.request if msg.kind == "request" else EntityType.response
    try:
        path = schema_name_map[modname][version][kind]
    except KeyError:
        return None
    module = kio_index.load_entity_module(modname, version, kind)
    return getattr(module, path.split(":", 1)[1]) if ":" in path else getattr(module, msg.name)


def same_shape(kcls: type, struct: Any, version: int) -> bool:
    """kio was generated from another Kafka release: skip the (few, unstable) message versions
    whose fields differ between the two schema sets."""
    ours = [f for f in struct.fields if version in f.versions]
    theirs = fields(kcls)
    if len(ours) != len(theirs):
        return False
    for f, k in zip(ours, theirs, strict=True):
        kafka_type = k.metadata.get("kafka_type")
        if f.is_struct != (kafka_type is None):
            return False
        if f.is_struct:
            nested = k.type if isinstance(k.type, type) else None
            if nested is None:
                args = getattr(k, "type", None)
                nested = _entity_of(kcls, k.name, args)
            if nested is None or not same_shape(nested, f.struct, version):
                return False
    return True


def _entity_of(kcls: type, name: str, annotation: Any) -> type | None:
    import typing

    hints = typing.get_type_hints(kcls)
    hint = hints[name]
    for arg in [hint, *typing.get_args(hint)]:
        for inner in [arg, *typing.get_args(arg)]:
            if is_dataclass(inner):
                return inner  # type: ignore[return-value]
    return None


def _cases() -> tuple[dict[tuple[str, str], list[int]], list[str]]:
    """(module, kind) -> the versions kio covers with the same fields; and the mismatches."""
    cases: dict[tuple[str, str], list[int]] = {}
    skipped = []
    for modname, msg in api_messages():
        for v in msg.versions:
            kcls = kio_class(modname, msg, v)
            if kcls is None:
                continue
            if not same_shape(kcls, msg.root, v):
                skipped.append(f"{modname}-{msg.kind}-v{v}")
                continue
            cases.setdefault((modname, msg.kind), []).append(v)
    return cases, skipped


VERSIONS, SCHEMA_MISMATCHES = _cases()
CASES = [pytest.param(m, k, id=f"{m}-{k}") for m, k in VERSIONS]


def plain_kio(value: Any) -> Any:
    """kio's values as plain data: timedeltas/datetimes back to milliseconds, tuples to lists."""
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    if isinstance(value, datetime.datetime):
        return round((value - _EPOCH).total_seconds() * 1000)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [plain_kio(v) for v in value]
    if is_dataclass(value):
        return [plain_kio(getattr(value, f.name)) for f in fields(value)]
    if isinstance(value, bytes | memoryview):
        return bytes(value)
    return value


def plain_tidelog(value: Any, struct: Any, version: int, classes: dict[str, type]) -> Any:
    """tidelog's values of the fields ``version`` has, in schema order (kio's field order)."""
    out = []
    for f in struct.fields:
        if version not in f.versions:
            continue
        v = getattr(value, f.py)
        if v is None and f.is_struct and f.tag is not None and f.default != "null":
            v = classes[f.type]()  # absent tagged struct: kio fills in the defaults
        if v is None:
            out.append(None)
        elif f.is_struct and f.is_array:
            out.append([plain_tidelog(e, f.struct, version, classes) for e in v])
        elif f.is_struct:
            out.append(plain_tidelog(v, f.struct, version, classes))
        elif f.is_array:
            out.append([bytes(e) if isinstance(e, bytes | memoryview) else e for e in v])
        elif isinstance(v, bytes | memoryview):
            out.append(bytes(v))
        else:
            out.append(v)
    return out


def agree(theirs: Any, ours: Any) -> bool:
    """Equal, except that kio reads a -1 timestamp as None (its 'no timestamp')."""
    if isinstance(theirs, list) and isinstance(ours, list):
        return len(theirs) == len(ours) and all(map(agree, theirs, ours))
    if theirs is None and (ours == -1 or ours == _ZERO_UUID):
        return True  # kio: -1 timestamps and the zero uuid read as None
    return bool(theirs == ours)


def kio_friendly(msg: Any, classes: dict[str, type], version: int) -> st.SearchStrategy[Any]:
    # kio maps *_ms fields to timedelta and timestamps to aware datetimes, which cannot
    # represent every int64: keep integers within what both sides can express.
    return message_strategy(msg, classes, version, kio_safe=True)


@pytest.mark.parametrize(("modname", "kind"), CASES)
# derandomized: kio's own value limits must not make this test flaky; tidelog's codecs get
# fresh random inputs in test_message_roundtrip.py
@settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_tidelog_and_kio_agree(modname: str, kind: str, data: st.DataObject) -> None:
    module = importlib.import_module(f"tidelog.protocol.messages.{modname}")
    msg, classes = next((m, c) for m, c in messages_with_classes(modname) if m.kind == kind)
    for version in VERSIONS[(modname, kind)]:
        kcls = kio_class(modname, msg, version)
        message = data.draw(kio_friendly(msg, classes, version), label=f"v{version}")
        wire = b"".join(getattr(module, f"encode_{kind}")(version, message))

        kio_message, size = entity_reader(kcls)(wire, 0)
        assert size == len(wire)
        assert agree(plain_kio(kio_message), plain_tidelog(message, msg.root, version, classes))

        buf = io.BytesIO()
        entity_writer(kcls)(buf, kio_message)
        kio_wire = buf.getvalue()
        decoded, end = getattr(module, f"decode_{kind}")(version, kio_wire)
        assert end == len(kio_wire)
        assert decoded == message
        assert kio_wire == wire


def test_kio_covers_most_of_our_versions() -> None:
    assert sum(map(len, VERSIONS.values())) > 450
    # only unstable share-group / KRaft APIs changed between the two Kafka releases
    assert len(SCHEMA_MISMATCHES) < 40, SCHEMA_MISMATCHES


def kio_strategy(cls: type) -> st.SearchStrategy[Any]:
    """Random instances of a kio entity from its own type hints (hypothesis hooks on kio's
    primitive types), with collections kept short."""
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{f.name: _kio_type(hints[f.name]) for f in fields(cls)})


def _kio_type(tp: Any) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(tp)
    if origin is tuple:
        return st.lists(_kio_type(typing.get_args(tp)[0]), max_size=2).map(tuple)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([_kio_type(arg) for arg in typing.get_args(tp)])
    if tp is type(None):
        return st.none()
    if is_dataclass(tp):
        return st.deferred(lambda: kio_strategy(tp))
    return st.from_type(tp)


def _served_cases() -> list[Any]:
    from tidelog.protocol.api_keys import api_spec
    from tidelog.protocol.api_versions import advertised

    served = {api_spec(key).module_name for key in advertised()}
    return [case for case in CASES if case.values[0] in served]


@pytest.mark.parametrize(("modname", "kind"), _served_cases())
@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.generate],
)
@given(data=st.data())
def test_kio_messages_decode_identically_in_tidelog(
    modname: str, kind: str, data: st.DataObject
) -> None:
    """The other way round, for the APIs tidelog serves: messages kio builds (its own types,
    its own random values) decode in tidelog to the same values and re-encode to bytes kio
    reads back as the same message."""
    from kio.static.primitive import Records

    st.register_type_strategy(Records, st.binary(max_size=24))
    module = importlib.import_module(f"tidelog.protocol.messages.{modname}")
    msg, classes = next((m, c) for m, c in messages_with_classes(modname) if m.kind == kind)
    for version in VERSIONS[(modname, kind)]:
        kcls = kio_class(modname, msg, version)
        kio_message = data.draw(kio_strategy(kcls), label=f"v{version}")
        buf = io.BytesIO()
        entity_writer(kcls)(buf, kio_message)
        kio_wire = buf.getvalue()

        ours, end = getattr(module, f"decode_{kind}")(version, kio_wire)
        assert end == len(kio_wire)
        assert agree(plain_kio(kio_message), plain_tidelog(ours, msg.root, version, classes))
        wire = b"".join(getattr(module, f"encode_{kind}")(version, ours))
        assert entity_reader(kcls)(wire, 0) == (kio_message, len(wire)), f"v{version}"
