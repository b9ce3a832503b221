"""Whole requests and responses: headers by API and version, zero-copy records, tagged fields."""

from __future__ import annotations

import struct
import uuid

import pytest

from tidelog.protocol import codec
from tidelog.protocol.api_keys import ApiKey, UnknownApiKeyError, api_spec
from tidelog.protocol.errors import DecodeError, ErrorCode
from tidelog.protocol.headers import RequestHeader, request_header_version, response_header_version
from tidelog.protocol.messages import api_versions as av
from tidelog.protocol.messages import controlled_shutdown as cs
from tidelog.protocol.messages import fetch, metadata, produce


def frame_payload(parts: list) -> bytes:
    data = b"".join(parts)
    assert struct.unpack_from(">i", data)[0] == len(data) - 4
    return data[4:]


def produce_request(records: bytes) -> produce.ProduceRequest:
    return produce.ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=30000,
        topic_data=[produce.TopicProduceData("orders", [produce.PartitionProduceData(3, records)])],
    )


@pytest.mark.parametrize("version", [3, 8, 9, 11])
def test_produce_request_round_trips_with_records_as_a_view_of_the_frame(version: int) -> None:
    records = bytes(range(256)) * 40
    payload = frame_payload(codec.encode_request(produce_request(records), version, 42, "cli"))
    frame = memoryview(payload)
    header, request = codec.decode_request(frame)
    assert header == RequestHeader(0, version, 42, "cli")
    got = request.topic_data[0].partition_data[0].records
    assert isinstance(got, memoryview) and got.obj is payload  # no copy of the record data
    assert got == records
    assert request == produce_request(records)


def test_fetch_response_keeps_record_buffers_out_of_the_join() -> None:
    batches = [bytes([i]) * 16384 for i in range(3)]
    response = fetch.FetchResponse(
        responses=[
            fetch.FetchableTopicResponse(
                topic="t",
                partitions=[
                    fetch.PartitionData(partition_index=i, high_watermark=10, records=b)
                    for i, b in enumerate(batches)
                ],
            )
        ]
    )
    parts = codec.encode_response(1, 7, response, 12)
    for b in batches:
        assert any(part is b for part in parts)  # passed through, not copied
    header, decoded = codec.decode_response(ApiKey.FETCH, 12, frame_payload(parts))
    assert header.correlation_id == 7
    assert decoded == response


def test_records_may_be_a_list_of_buffers() -> None:
    chunks = [b"a" * 5000, memoryview(b"b" * 6000)]
    response = fetch.FetchResponse(
        responses=[
            fetch.FetchableTopicResponse("t", partitions=[fetch.PartitionData(records=chunks)])
        ]
    )
    parts = codec.encode_response(0, 1, response, 4)
    assert any(part is chunks[1] for part in parts)
    _, decoded = codec.decode_response(ApiKey.FETCH, 4, frame_payload(parts))
    assert decoded.responses[0].partitions[0].records == b"a" * 5000 + b"b" * 6000


def test_tagged_fields_holding_their_default_are_never_written() -> None:
    plain = fetch.FetchResponse(
        responses=[fetch.FetchableTopicResponse("t", partitions=[fetch.PartitionData(records=b"")])]
    )
    diverging = fetch.FetchResponse(
        responses=[
            fetch.FetchableTopicResponse(
                "t",
                partitions=[
                    fetch.PartitionData(
                        records=b"", diverging_epoch=fetch.EpochEndOffset(epoch=4, end_offset=99)
                    )
                ],
            )
        ]
    )
    a = b"".join(fetch.encode_response(12, plain))
    b = b"".join(fetch.encode_response(12, diverging))
    # tag 0, size 13 (epoch int32 + end_offset int64 + empty tag section)
    assert len(b) - len(a) == 2 + 13
    assert fetch.decode_response(12, b)[0] == diverging
    resp = av.ApiVersionsResponse(finalized_features_epoch=-1)
    assert b"".join(av.encode_response(3, resp)) == bytes.fromhex("0000010000000000")


def test_unknown_tagged_fields_are_kept_and_written_back() -> None:
    wire = bytes.fromhex("00000100000000010502abcd")  # ApiVersions v3, tag 5
    resp, end = av.decode_response(3, wire)
    assert end == len(wire) and resp.unknown_tagged_fields == [(5, b"\xab\xcd")]
    assert b"".join(av.encode_response(3, resp)) == wire


def test_header_versions_follow_the_api_and_version() -> None:
    assert request_header_version(ApiKey.PRODUCE, 8) == 1
    assert request_header_version(ApiKey.PRODUCE, 9) == 2
    assert request_header_version(ApiKey.CONTROLLED_SHUTDOWN, 0) == 0
    assert response_header_version(ApiKey.METADATA, 8) == 0
    assert response_header_version(ApiKey.METADATA, 9) == 1
    assert response_header_version(ApiKey.API_VERSIONS, 3) == 0  # always v0


def test_api_versions_response_header_is_v0_even_when_flexible() -> None:
    resp = av.ApiVersionsResponse(api_keys=[av.ApiVersion(18, 0, 4)])
    hv = api_spec(ApiKey.API_VERSIONS).response_header_version(4)
    payload = frame_payload(codec.encode_response(hv, 9, resp, 4))
    assert payload[:4] == struct.pack(">i", 9)
    assert payload[4:6] == b"\x00\x00"  # error code right after the correlation id
    assert codec.decode_response(ApiKey.API_VERSIONS, 4, payload)[1] == resp


def test_controlled_shutdown_v0_uses_request_header_v0() -> None:
    payload = frame_payload(codec.encode_request(cs.ControlledShutdownRequest(broker_id=2), 0, 5))
    assert payload == struct.pack(">hhii", 7, 0, 5, 2)
    header, request = codec.decode_request(payload)
    assert header.correlation_id == 5 and request.broker_id == 2


def test_flexible_request_header_keeps_a_legacy_client_id() -> None:
    request = metadata.MetadataRequest(topics=None)
    payload = frame_payload(codec.encode_request(request, 12, 3, "kcat"))
    assert payload[8:15] == b"\x00\x04kcat\x00"  # int16 length, no compact encoding; no tags
    header, decoded = codec.decode_request(payload)
    assert header.client_id == "kcat" and decoded.topics is None


def test_uuid_fields_round_trip() -> None:
    topic_id = uuid.uuid4()
    response = metadata.MetadataResponse(
        topics=[metadata.MetadataResponseTopic(error_code=0, name="t", topic_id=topic_id)]
    )
    _, decoded = codec.decode_response(
        3, 12, frame_payload(codec.encode_response(1, 1, response, 12))
    )
    assert decoded.topics[0].topic_id == topic_id


def test_unsupported_unknown_and_padded_requests() -> None:
    future = struct.pack(">hhih", ApiKey.API_VERSIONS, 99, 17, -1) + b"\x00"
    with pytest.raises(codec.UnsupportedVersionError) as info:
        codec.decode_request(future)
    assert (info.value.api_key, info.value.api_version, info.value.correlation_id) == (18, 99, 17)
    with pytest.raises(UnknownApiKeyError):
        codec.decode_request(struct.pack(">hhih", 999, 0, 1, -1))
    with pytest.raises(DecodeError, match="shorter than a request header"):
        codec.decode_request(b"\x00\x00\x00")
    ok = frame_payload(codec.encode_request(metadata.MetadataRequest(topics=[]), 1, 1))
    assert codec.decode_request(ok + b"\x00\x01")[1] == metadata.MetadataRequest(topics=[])


def test_unsupported_api_versions_answer_is_kafkas_v0_error_body() -> None:
    from tidelog.protocol.api_versions import unsupported_api_versions_frame

    parts = unsupported_api_versions_frame(7)
    # size 16, correlation id 7, UNSUPPORTED_VERSION, [ApiVersions 0..4]
    assert b"".join(parts).hex() == "0000001000000007002300000001001200000004"
    assert ErrorCode.UNSUPPORTED_VERSION == 0x23


def test_unencodable_values_raise_a_clear_encode_error() -> None:
    from tidelog.protocol.errors import EncodeError

    bad_range = metadata.MetadataRequest(topics=[metadata.MetadataRequestTopic(name="t")])
    bad_range.topics[0].name = None  # non-nullable before v10
    with pytest.raises(EncodeError, match="cannot encode MetadataRequest v1"):
        codec.encode_request(bad_range, 1, 1)
    overflow = produce.ProduceResponse(throttle_time_ms=2**31)
    with pytest.raises(EncodeError, match="ProduceResponse v1"):
        codec.encode_response(0, 1, overflow, 1)
