"""Whole requests and responses: header + body, framed, in both directions.

Server side: :func:`decode_request` (a frame from :class:`~tidelog.protocol.framing.FrameReader`
-> header and message) and :func:`encode_response` (-> a list of buffers for ``writelines``; the
record data of Fetch/Produce stays its own, uncopied buffer). Client side (tidelog's client,
fetchers, the controller channel): :func:`encode_request` and :func:`decode_response`.
"""

from __future__ import annotations

from struct import Struct
from struct import error as StructError
from typing import Any

from tidelog.protocol.api_keys import api_spec
from tidelog.protocol.errors import DecodeError
from tidelog.protocol.headers import (
    RequestHeader,
    ResponseHeader,
    decode_response_header,
    encode_request_header,
    encode_response_header,
    peek_api,
)
from tidelog.protocol.messages.request_header import HEADER_DECODERS as _HEADER_DECODERS
from tidelog.protocol.primitives import coalesce

__all__ = [
    "UnsupportedVersionError",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
]

_SIZE = Struct(">i")


class UnsupportedVersionError(DecodeError):
    """A known API at a version Kafka's schemas (and so tidelog) cannot parse.

    Carries what the broker needs to answer: ApiVersions answers UNSUPPORTED_VERSION in a v0
    body; every other API closes the connection, as Kafka does.
    """

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(f"api key {api_key} version {api_version} is not supported")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


def decode_request(frame: memoryview | bytes) -> tuple[RequestHeader, Any]:
    """Decode one request frame (without its size prefix).

    Raises :class:`DecodeError` for anything malformed, :class:`UnsupportedVersionError` for a
    version outside the schema's range, ``UnknownApiKeyError`` for an unknown key.
    """
    view = _view(frame)
    api_key, api_version, correlation_id = peek_api(view)
    spec = api_spec(api_key)
    if not spec.min_version <= api_version <= spec.max_version:
        raise UnsupportedVersionError(api_key, api_version, correlation_id)
    n = len(view)
    try:
        # straight to the generated per-version functions: one bounds-error translation
        header, pos = _HEADER_DECODERS[spec.request_header_version(api_version)](view, 0, n)
        # Bytes after the body are ignored, as Kafka does: librdkafka's all-topics Metadata
        # v12 request carries three stray bytes after its tagged fields.
        body, _ = spec.module.REQUEST_DECODERS[api_version](view, pos, n)
    except DecodeError:
        raise
    except (StructError, IndexError, UnicodeDecodeError, ValueError) as e:
        raise DecodeError(f"malformed {spec.name} v{api_version} request: {e}") from None
    return header, body


def _view(frame: memoryview | bytes) -> memoryview:
    if type(frame) is memoryview and frame.format == "B":
        return frame
    return memoryview(frame).cast("B")


def _framed(parts: list) -> list:
    parts = coalesce(parts)
    size = 0
    for part in parts:
        size += len(part)
    parts[0] = _SIZE.pack(size) + parts[0]
    return parts


def encode_response(
    header_version: int, correlation_id: int, response: Any, api_version: int
) -> list[bytes | memoryview]:
    """Frame ``response`` (size prefix, response header, body) as a list of buffers."""
    parts: list = [encode_response_header(correlation_id, header_version)]
    api_spec(response.API_KEY).module.encode_response(api_version, response, parts)
    return _framed(parts)


def encode_request(
    request: Any, api_version: int, correlation_id: int, client_id: str | None = "tidelog"
) -> list[bytes | memoryview]:
    """Frame ``request`` with the request header version its API and version require."""
    spec = api_spec(request.API_KEY)
    if not spec.min_version <= api_version <= spec.max_version:
        raise ValueError(f"{spec.name} version {api_version} is not defined")
    header = RequestHeader(spec.api_key, api_version, correlation_id, client_id)
    parts: list = []
    encode_request_header(header, spec.request_header_version(api_version), parts)
    spec.module.encode_request(api_version, request, parts)
    return _framed(parts)


def decode_response(
    api_key: int, api_version: int, frame: memoryview | bytes
) -> tuple[ResponseHeader, Any]:
    """Decode one response frame (without its size prefix) to a request we sent."""
    spec = api_spec(api_key)
    view = frame if isinstance(frame, memoryview) else memoryview(frame)
    header, pos = decode_response_header(view, spec.response_header_version(api_version))
    body, end = spec.module.decode_response(api_version, view, pos)
    if end != len(view):
        raise DecodeError(
            f"{spec.name} v{api_version} response has {len(view) - end} trailing bytes"
        )
    return header, body
