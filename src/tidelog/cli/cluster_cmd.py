"""`tidelog cluster up|status|stop-broker|start-broker|down`: a local cluster on 127.0.0.1.

See `tidelog.cluster.local` for what runs where. `up` prints a table of the brokers and the
bootstrap servers as its last line, so scripts can take it with `tail -1`.
"""

from __future__ import annotations

import sys
from typing import Any

import click

DEFAULT_DIR = "tidelog-cluster"


def _err(msg: str) -> None:
    click.echo(f"error: {msg}", err=True)
    sys.exit(1)


def _progress(msg: str) -> None:
    click.echo(f"  {msg}", err=True)


def _table(cluster: Any, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    rows = cluster.status()
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze addresses to fit 80 columns
        console = Console(width=200)
    table = Table(title=title)
    for col in ("broker", "address", "pid", "alive", "registered", "controller", "log"):
        table.add_column(col)
    for s in rows:
        b = cluster.brokers[s.id]
        table.add_row(
            str(s.id), b.address, str(s.pid or "-"),
            "yes" if s.alive else "no",
            "?" if s.registered is None else ("yes" if s.registered else "no"),
            "*" if s.controller else "",
            _relative(b.log_file, cluster.dir),
        )
    console.print(table)


def _relative(path: str, root: Any) -> str:
    from pathlib import Path

    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path


@click.group()
def cluster() -> None:
    """Run a local cluster: a private ZooKeeper and N brokers on 127.0.0.1."""
    import logging

    # kazoo reports every reconnection attempt; the tool reports what matters itself.
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)


def _dir_option(f: Any) -> Any:
    return click.option("--dir", "directory", default=DEFAULT_DIR, show_default=True,
                        help="The cluster's directory (cluster.json, logs, data).")(f)


@cluster.command()
@_dir_option
@click.option("--brokers", default=3, show_default=True, type=click.IntRange(1, 64),
              help="Number of brokers.")
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="A server.properties setting for every broker (repeatable).")
@click.option("--timeout", default=90.0, show_default=True,
              help="Seconds to wait for every broker to register and a controller.")
def up(directory: str, brokers: int, overrides: tuple[str, ...], timeout: float) -> None:
    """Start ZooKeeper and the brokers; wait until they are registered and a controller is
    elected; print the bootstrap servers last."""
    from tidelog.broker.config import ConfigError, parse_overrides
    from tidelog.cluster.local import ClusterError, LocalCluster

    try:
        props = parse_overrides(overrides)
    except (ConfigError, ValueError) as e:
        _err(f"bad --override: {e}")
    c = LocalCluster(directory)
    try:
        c.up(brokers, props, timeout_s=timeout, progress=_progress)
    except ClusterError as e:
        _err(str(e))
    _table(c, f"tidelog cluster in {c.dir} (ZooKeeper {c.zookeeper})")
    click.echo(c.bootstrap_servers)


@cluster.command()
@_dir_option
def status(directory: str) -> None:
    """Show every broker: port, pid, alive, registered, controller."""
    from tidelog.cluster.local import ClusterError, LocalCluster

    try:
        c = LocalCluster.load(directory)
    except ClusterError as e:
        _err(str(e))
    _table(c, f"tidelog cluster in {c.dir} (ZooKeeper {c.zookeeper})")
    click.echo(c.bootstrap_servers)


@cluster.command("stop-broker")
@_dir_option
@click.option("--broker", "broker_id", required=True, type=int, help="Broker id.")
@click.option("--kill", is_flag=True, help="SIGKILL (a crash) instead of SIGTERM (controlled "
              "shutdown).")
@click.option("--timeout", default=60.0, show_default=True,
              help="Seconds to wait after SIGTERM before SIGKILL.")
def stop_broker(directory: str, broker_id: int, kill: bool, timeout: float) -> None:
    """Stop one broker: SIGTERM (controlled shutdown) or --kill (SIGKILL)."""
    from tidelog.cluster.local import ClusterError, LocalCluster

    try:
        c = LocalCluster.load(directory)
        click.echo(c.stop_broker(broker_id, kill=kill, timeout_s=timeout))
    except ClusterError as e:
        _err(str(e))


@cluster.command("start-broker")
@_dir_option
@click.option("--broker", "broker_id", required=True, type=int, help="Broker id.")
@click.option("--timeout", default=60.0, show_default=True,
              help="Seconds to wait until it is registered.")
def start_broker(directory: str, broker_id: int, timeout: float) -> None:
    """Start a stopped broker again (same port, config and data)."""
    from tidelog.cluster.local import ClusterError, LocalCluster

    try:
        c = LocalCluster.load(directory)
        click.echo(c.start_broker(broker_id, timeout_s=timeout, progress=_progress))
    except ClusterError as e:
        _err(str(e))


@cluster.command()
@_dir_option
@click.option("--timeout", default=30.0, show_default=True,
              help="Seconds to wait for the brokers' SIGTERM before SIGKILL.")
def down(directory: str, timeout: float) -> None:
    """Stop every broker and ZooKeeper started by `up` (by PID from cluster.json)."""
    from tidelog.cluster.local import ClusterError, LocalCluster

    try:
        c = LocalCluster.load(directory)
    except ClusterError as e:
        _err(str(e))
    c.down(timeout_s=timeout, progress=_progress)
    click.echo(f"cluster in {c.dir} is down")
