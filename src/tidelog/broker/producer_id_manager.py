"""Producer ids for InitProducerId, from blocks reserved in ZooKeeper (Kafka's ZK-mode
`ProducerIdManager`).

`/latest_producer_id_block` holds the last block handed to any broker:
`{"version":1,"broker":<id>,"block_start":"<first>","block_end":"<last>"}`. A broker reserves the
next 1000 ids with a compare-and-set on the znode's version (retrying on a conflict), then hands
them out one by one, so ids are unique across the cluster without a round trip per producer.
"""

from __future__ import annotations

import json
import threading

from tidelog.controller.zk_data import PRODUCER_ID_BLOCK_PATH
from tidelog.controller.zk_interface import ZooKeeperClient

__all__ = ["PRODUCER_ID_BLOCK_PATH", "PRODUCER_ID_BLOCK_SIZE", "ProducerIdManager"]

PRODUCER_ID_BLOCK_SIZE = 1000
_MAX_ATTEMPTS = 50


class ProducerIdManager:
    """Thread-safe; `generate_producer_id()` blocks on ZooKeeper only when a block runs out."""

    def __init__(self, broker_id: int, zk: ZooKeeperClient) -> None:
        self.broker_id = broker_id
        self._zk = zk
        self._lock = threading.Lock()
        self._next = 0
        self._end = -1  # last id of the current block (inclusive)

    def _reserve_block(self) -> None:
        for _ in range(_MAX_ATTEMPTS):
            data, version = self._zk.get_data_and_version(PRODUCER_ID_BLOCK_PATH)
            if data:
                obj = json.loads(data.decode("utf-8"))
                start = int(obj["block_end"]) + 1
            else:
                start = 0
            if start > 2**63 - 1 - PRODUCER_ID_BLOCK_SIZE:
                raise RuntimeError("producer ids exhausted")
            end = start + PRODUCER_ID_BLOCK_SIZE - 1
            payload = json.dumps({
                "version": 1, "broker": self.broker_id,
                "block_start": str(start), "block_end": str(end),
            }).encode("utf-8")
            if data is None and version < 0:
                won = self._zk.create_path(PRODUCER_ID_BLOCK_PATH, payload)
            else:
                won = self._zk.conditional_update_path(PRODUCER_ID_BLOCK_PATH, payload, version)
            if not won:
                continue  # another broker took a block first: read again
            self._next, self._end = start, end
            return
        raise RuntimeError("could not reserve a producer id block (too much contention)")

    def generate_producer_id(self) -> int:
        with self._lock:
            if self._next > self._end:
                self._reserve_block()
            pid = self._next
            self._next += 1
            return pid
