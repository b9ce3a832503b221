"""The client's exceptions: transport failures and Kafka error codes raised as exceptions."""

from __future__ import annotations

from tidelog.protocol.errors import ErrorCode, error_name

__all__ = [
    "BrokerResponseError",
    "KafkaClientError",
    "KafkaConnectionError",
    "NoBrokersAvailableError",
    "RequestTimedOutError",
    "UnsupportedVersionError",
    "error_for_code",
]


class KafkaClientError(Exception):
    """Base of every error tidelog's client raises."""

    retriable: bool = False


class KafkaConnectionError(KafkaClientError):
    """The TCP connection could not be opened, was closed, or broke the protocol."""

    retriable = True


class RequestTimedOutError(KafkaClientError):
    """No response within the request timeout. The connection stays open for other requests."""

    retriable = True


class NoBrokersAvailableError(KafkaClientError):
    """None of the bootstrap servers (or known brokers) answered."""

    retriable = True


class UnsupportedVersionError(KafkaClientError):
    """The broker and this client share no version of an API (or the broker lacks it)."""


class BrokerResponseError(KafkaClientError):
    """A Kafka error code in a response, as an exception (``.code`` is the :class:`ErrorCode`)."""

    def __init__(self, code: int, detail: str = "") -> None:
        self.code_value = code
        try:
            self.code: ErrorCode | None = ErrorCode(code)
        except ValueError:
            self.code = None
        self.retriable = bool(self.code is not None and self.code.retriable)
        text = error_name(code)
        if detail:
            text = f"{text}: {detail}"
        elif self.code is not None and self.code.message:
            text = f"{text}: {self.code.message}"
        super().__init__(text)


def error_for_code(code: int, detail: str = "") -> BrokerResponseError | None:
    """``None`` for NONE (0), otherwise the exception for ``code``."""
    if code == 0:
        return None
    return BrokerResponseError(code, detail)
