"""The committed generated modules are exactly what tools/gen_protocol.py writes today."""

from __future__ import annotations

from protocol_schema import ROOT, gen_protocol


def test_generated_modules_match_the_generator() -> None:
    files = gen_protocol().generate()
    out = ROOT / "src" / "tidelog" / "protocol" / "messages"
    stale = [name for name, text in files.items() if (out / name).read_text() != text]
    extra = sorted(p.name for p in out.glob("*.py") if p.name not in files)
    assert not stale and not extra, f"run tools/gen_protocol.py: stale={stale} extra={extra}"


def test_schemas_are_vendored_with_their_provenance() -> None:
    schemas = ROOT / "tools" / "schemas"
    assert (schemas / "SOURCE_COMMIT").read_text().strip()
    assert "Apache" in (schemas / "NOTICE").read_text()
    assert len(list(schemas.glob("*.json"))) >= 180


def test_every_api_the_broker_needs_is_generated_in_every_version() -> None:
    from tidelog.protocol.api_keys import ApiKey, api_spec

    needed = {
        "PRODUCE": 11,
        "FETCH": 17,
        "LIST_OFFSETS": 10,
        "METADATA": 12,
        "OFFSET_FOR_LEADER_EPOCH": 4,
        "API_VERSIONS": 4,
        "CREATE_TOPICS": 7,
        "DELETE_TOPICS": 6,
        "DESCRIBE_CONFIGS": 4,
        "INIT_PRODUCER_ID": 5,
        "FIND_COORDINATOR": 6,
        "JOIN_GROUP": 9,
        "SYNC_GROUP": 5,
        "HEARTBEAT": 4,
        "LEAVE_GROUP": 5,
        "OFFSET_COMMIT": 9,
        "OFFSET_FETCH": 9,
        "LIST_GROUPS": 5,
        "DESCRIBE_GROUPS": 5,
        "LEADER_AND_ISR": 7,
        "STOP_REPLICA": 4,
        "UPDATE_METADATA": 8,
        "CONTROLLED_SHUTDOWN": 3,
        "ALTER_PARTITION": 3,
    }
    for name, max_version in needed.items():
        spec = api_spec(ApiKey[name])
        assert spec.max_version == max_version, name
        module = spec.module
        assert len(module.REQUEST_DECODERS) == len(module.RESPONSE_ENCODERS) == max_version + 1
