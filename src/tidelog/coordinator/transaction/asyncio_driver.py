"""The asyncio broker's side of the coordinator's driver interfaces (driver.py): tasks on the
running event loop, appends through the broker's replica manager, WriteTxnMarkers and the
partition leaders' AddPartitionsToTxn verifications over one connection per broker (this
broker's own without a socket)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from tidelog.client.connection import BrokerConnection
from tidelog.protocol.messages import write_txn_markers as m_wtm
from tidelog.replication.types import TopicPartition
from tidelog.storage.transactions import AppendOrigin

__all__ = ["AsyncioTasks", "BrokerConnections", "ConnectionMarkerTransport", "ConnectionTransport",
           "LocalMarkerWriter", "ReplicaManagerAppender"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# This broker's own WriteTxnMarkers logic, called without a socket.
LocalMarkerWriter = Callable[[m_wtm.WriteTxnMarkersRequest],
                             Awaitable[m_wtm.WriteTxnMarkersResponse]]


class AsyncioTasks:
    """Tasks on the running loop; `cancel_all` ends those still running (at shutdown)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("transaction coordinator task failed", exc_info=task.exception())

    async def sleep(self, ms: int) -> None:
        await asyncio.sleep(ms / 1000)

    async def gather(self, aws: list[Awaitable[T]]) -> list[T]:
        return list(await asyncio.gather(*aws))

    def promise(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    async def join(self) -> None:
        """Wait until the tasks running now have ended."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def cancel_all(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t


class ReplicaManagerAppender:
    """Appends through the broker's replica manager (`BrokerReplicaManager.append_records`)."""

    def __init__(self, replica_manager: Any) -> None:
        self.rm = replica_manager

    @property
    def core(self) -> Any:
        return self.rm.core

    def append(self, entries: Mapping[TopicPartition, Any], timeout_ms: int
               ) -> Awaitable[Mapping[TopicPartition, Any]]:
        return self.rm.append_records(-1, entries, timeout_ms,  # type: ignore[no-any-return]
                                      origin=AppendOrigin.COORDINATOR)


class BrokerConnections:
    """One `BrokerConnection` per broker, found in the metadata cache; a failed connection is
    dropped and made again on the next send (the inter-broker client of the transaction
    marker sender and of the partition leaders' transaction verification)."""

    def __init__(self, broker_id: int, metadata_cache: Any, client_id: str, *,
                 request_timeout_ms: int = 30_000) -> None:
        self.broker_id = broker_id
        self.cache = metadata_cache
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self._connections: dict[int, BrokerConnection] = {}
        # One connection per broker even when several requests start at once.
        self._connecting: dict[int, asyncio.Lock] = {}

    async def send(self, broker_id: int, request: Any, api_version: int | None = None) -> Any:
        conn = await self._connection(broker_id)
        try:
            return await conn.send(request, api_version)
        except Exception:
            # Only this connection: a send stuck behind a peer that stopped reading fails at
            # its timeout, after a concurrent send may have opened a new, healthy one.
            if self._connections.get(broker_id) is conn:
                del self._connections[broker_id]
            with contextlib.suppress(Exception):
                await conn.close()
            raise

    async def close(self) -> None:
        for conn in self._connections.values():
            with contextlib.suppress(Exception):
                await conn.close()
        self._connections.clear()

    async def _connection(self, broker_id: int) -> BrokerConnection:
        async with self._connecting.setdefault(broker_id, asyncio.Lock()):
            conn = self._connections.get(broker_id)
            if conn is not None and not conn.closed:
                return conn
            endpoint = self.cache.endpoint(broker_id)
            if endpoint is None:
                raise ConnectionError(f"broker {broker_id} has no known endpoint")
            conn = BrokerConnection(endpoint.host, endpoint.port, client_id=self.client_id,
                                    request_timeout_ms=self.request_timeout_ms)
            await conn.connect(timeout_s=self.request_timeout_ms / 1000)
            self._connections[broker_id] = conn
            return conn


class ConnectionTransport:
    """One kind of broker-to-broker request over `BrokerConnections`, sent as ``api_version``
    (None: the newest both support); this broker's own answered by ``local`` without a
    socket."""

    def __init__(self, broker_id: int, metadata_cache: Any,
                 local: Callable[[Any], Awaitable[Any]], client_id: str, *,
                 api_version: int | None = None, request_timeout_ms: int = 30_000) -> None:
        self.broker_id = broker_id
        self.local = local
        self.api_version = api_version
        self.connections = BrokerConnections(broker_id, metadata_cache, client_id,
                                             request_timeout_ms=request_timeout_ms)

    async def send(self, broker_id: int, request: Any) -> Any:
        if broker_id == self.broker_id:
            return await self.local(request)
        return await self.connections.send(broker_id, request, self.api_version)

    async def close(self) -> None:
        await self.connections.close()


class ConnectionMarkerTransport(ConnectionTransport):
    """WriteTxnMarkers over `BrokerConnections`; this broker's own partitions without a
    socket."""

    def __init__(self, broker_id: int, metadata_cache: Any, write_locally: LocalMarkerWriter,
                 *, request_timeout_ms: int = 30_000) -> None:
        super().__init__(broker_id, metadata_cache, write_locally,
                         f"broker-{broker_id}-txn-marker-sender",
                         request_timeout_ms=request_timeout_ms)
