"""The API registry: api key -> name, message classes, versions, header versions, codecs.

Generated codec modules are imported lazily (importing all 88 costs ~0.5 s); the first lookup of
an API imports its module once.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cached_property
from types import ModuleType
from typing import Any

from tidelog.protocol.errors import DecodeError
from tidelog.protocol.messages._index import APIS, ApiKey

__all__ = ["ApiKey", "ApiSpec", "UnknownApiKeyError", "api_spec", "all_specs"]


class UnknownApiKeyError(DecodeError):
    """A request names an API key Kafka's schemas do not define."""


@dataclass(frozen=True)
class ApiSpec:
    api_key: int
    module_name: str  # e.g. "produce" (tidelog.protocol.messages.produce)
    name: str  # Kafka's name, e.g. "Produce"
    request_class_name: str
    response_class_name: str
    min_version: int
    max_version: int
    flexible_from: int | None  # first flexible version, None if the API has none

    @cached_property
    def module(self) -> ModuleType:
        return importlib.import_module(f"tidelog.protocol.messages.{self.module_name}")

    @property
    def request_class(self) -> type[Any]:
        return getattr(self.module, self.request_class_name)  # type: ignore[no-any-return]

    @property
    def response_class(self) -> type[Any]:
        return getattr(self.module, self.response_class_name)  # type: ignore[no-any-return]

    def is_flexible(self, version: int) -> bool:
        return self.flexible_from is not None and version >= self.flexible_from

    def request_header_version(self, version: int) -> int:
        # ControlledShutdown v0 predates the client id (Kafka special-cases it the same way).
        if self.api_key == ApiKey.CONTROLLED_SHUTDOWN and version == 0:
            return 0
        return 2 if self.is_flexible(version) else 1

    def response_header_version(self, version: int) -> int:
        # ApiVersions responses never carry a flexible header: a client that does not yet
        # know the broker's versions must be able to parse it.
        if self.api_key == ApiKey.API_VERSIONS:
            return 0
        return 1 if self.is_flexible(version) else 0


_SPECS: dict[int, ApiSpec] = {key: ApiSpec(key, *row) for key, row in APIS.items()}


def api_spec(api_key: int) -> ApiSpec:
    try:
        return _SPECS[api_key]
    except KeyError:
        raise UnknownApiKeyError(f"unknown api key {api_key}") from None


def all_specs() -> list[ApiSpec]:
    return [_SPECS[k] for k in sorted(_SPECS)]
