"""Test helpers: Kafka's schemas (through the generator's own model) and hypothesis strategies
producing random messages of the generated classes for one (message, version)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from hypothesis import strategies as st

from tidelog.protocol.errors import ErrorCode

ROOT = Path(__file__).resolve().parents[2]


@cache
def gen_protocol() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_protocol", ROOT / "tools" / "gen_protocol.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_protocol"] = module
    spec.loader.exec_module(module)
    return module


@cache
def schema_groups() -> dict[str, list[Any]]:
    """module name -> [request, response] (or [data] / [header]) schema models."""
    return gen_protocol().load()  # type: ignore[no-any-return]


def api_messages() -> list[tuple[str, Any]]:
    """(module name, message model) for every request and response schema."""
    out = []
    for modname, msgs in schema_groups().items():
        for m in msgs:
            if m.kind in ("request", "response"):
                out.append((modname, m))
    return out


def messages_with_classes(modname: str) -> list[tuple[Any, dict[str, type]]]:
    module = importlib.import_module(f"tidelog.protocol.messages.{modname}")
    msgs = schema_groups()[modname]
    maps = gen_protocol().class_names(msgs)
    return [
        (m, {k: getattr(module, v) for k, v in cmap.items()})
        for m, cmap in zip(msgs, maps, strict=True)
    ]


INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
}


def _scalar(kind: str, kio_safe: bool = False) -> st.SearchStrategy[Any]:
    if kind in INT_RANGES:
        lo, hi = INT_RANGES[kind]
        if kio_safe and kind in ("int32", "int64"):
            # kio turns *_ms fields into timedeltas and timestamps into datetimes
            lo, hi = -1, 2**31 - 1
        return st.integers(lo, hi)
    if kind == "bool":
        return st.booleans()
    if kind == "float64":
        return st.floats(allow_nan=False)
    if kind == "uuid":
        return st.uuids()
    if kind == "string":
        return st.text(max_size=12)
    if kind in ("bytes", "records"):
        return st.binary(max_size=24)
    raise AssertionError(kind)


def message_strategy(
    msg: Any, classes: dict[str, type], version: int, max_list: int = 2, kio_safe: bool = False
) -> st.SearchStrategy[Any]:
    """Random instances of ``msg``'s root class with every field of ``version`` populated."""

    def struct(s: Any) -> st.SearchStrategy[Any]:
        kwargs: dict[str, st.SearchStrategy[Any]] = {}
        for f in s.fields:
            if version not in f.versions:
                continue
            if f.is_struct:
                elem: st.SearchStrategy[Any] = st.deferred(lambda f=f: struct(f.struct))
            elif kio_safe and (
                "timestamp" in f.py or (f.py.endswith("_time_ms") and "throttle" not in f.py)
            ):
                elem = st.integers(0, 2**40)  # kio: aware datetimes, non-negative
            elif kio_safe and f.py.endswith("error_code"):
                elem = st.sampled_from([int(code) for code in ErrorCode])  # kio uses an enum
            else:
                elem = _scalar(f.type, kio_safe)
            value = st.lists(elem, max_size=max_list) if f.is_array else elem
            if f.is_struct and not f.is_array and f.tag is not None and f.default != "null":
                # a tagged struct holding its defaults is not written: it reads back as absent
                default = classes[f.type]()
                value = st.none() | value.filter(lambda x, d=default: x != d)
            if version in f.nullable:
                value = st.none() | value
            kwargs[f.py] = value
        return st.builds(classes[s.name], **kwargs)

    return struct(msg.root)
