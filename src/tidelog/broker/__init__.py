"""The asyncio shell of a broker: sockets, request dispatch, fetcher tasks, scheduler."""
