"""A fresh ZooKeeper chroot per test or module: isolated cluster state on one shared server."""

from __future__ import annotations

import uuid
from typing import Any


def new_chroot(zookeeper: Any, prefix: str = "t") -> str:
    """Create ``/<prefix>-<random>`` on ``zookeeper`` (a ZooKeeperServer) and return a connect
    string rooted there."""
    from kazoo.client import KazooClient

    chroot = f"/{prefix}-{uuid.uuid4().hex[:12]}"
    client = KazooClient(hosts=zookeeper.connect_string, timeout=10.0)
    client.start(timeout=15)
    try:
        client.ensure_path(chroot)
    finally:
        client.stop()
        client.close()
    return zookeeper.connect_string + chroot
