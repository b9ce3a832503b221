"""Request headers v0-v2 and response headers v0-v1, and which version an API uses."""

from __future__ import annotations

from struct import Struct

from tidelog.protocol.api_keys import api_spec
from tidelog.protocol.errors import DecodeError
from tidelog.protocol.messages import request_header as _rh
from tidelog.protocol.messages import response_header as _rsh
from tidelog.protocol.messages.request_header import RequestHeader
from tidelog.protocol.messages.response_header import ResponseHeader

__all__ = [
    "RequestHeader",
    "ResponseHeader",
    "decode_request_header",
    "decode_response_header",
    "encode_request_header",
    "encode_response_header",
    "peek_api",
    "request_header_version",
    "response_header_version",
]

_API = Struct(">hhi")
_V0 = Struct(">i")
_V1 = Struct(">iB")


def request_header_version(api_key: int, api_version: int) -> int:
    return api_spec(api_key).request_header_version(api_version)


def response_header_version(api_key: int, api_version: int) -> int:
    return api_spec(api_key).response_header_version(api_version)


def peek_api(frame: memoryview | bytes) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id): the part every request header version shares."""
    if len(frame) < 8:
        raise DecodeError(f"request of {len(frame)} bytes is shorter than a request header")
    return _API.unpack_from(frame, 0)  # type: ignore[return-value]


def decode_request_header(
    frame: memoryview | bytes, header_version: int | None = None
) -> tuple[RequestHeader, int]:
    """Decode the request header at the start of ``frame``; return it and the body offset.

    The header version follows from the API key and version unless given.
    """
    if header_version is None:
        api_key, api_version, _ = peek_api(frame)
        header_version = request_header_version(api_key, api_version)
    return _rh.decode_header(header_version, frame, 0)


def encode_request_header(header: RequestHeader, header_version: int, out: list) -> list:
    return _rh.encode_header(header_version, header, out)


def decode_response_header(
    frame: memoryview | bytes, header_version: int
) -> tuple[ResponseHeader, int]:
    return _rsh.decode_header(header_version, frame, 0)


def encode_response_header(correlation_id: int, header_version: int) -> bytes:
    # Response header v1 is the correlation id plus an empty tagged-field section.
    if header_version == 0:
        return _V0.pack(correlation_id)
    if header_version == 1:
        return _V1.pack(correlation_id, 0)
    raise ValueError(f"response header version {header_version} is not defined")
