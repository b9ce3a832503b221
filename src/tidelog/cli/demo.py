"""`tidelog demo`: the main job that `make demo` runs.

For now it exercises the storage engine end to end through the CLI: write a partition log with
compressed batches, read it back, and describe it. Later steps grow it into the full cluster and
Spark pipeline demo.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import click
from rich.console import Console

DEFAULT_DIR = "demo-data"


@click.command()
@click.option(
    "--dir",
    "data_dir",
    default=DEFAULT_DIR,
    show_default=True,
    help="Where the demo keeps its data; wiped at the start of every run.",
)
@click.option("--count", default=20_000, show_default=True, help="Records to write.")
def demo(data_dir: str, count: int) -> None:
    """Write a partition log, read it back and describe it."""
    from tidelog.cli.main import cli

    console = Console()
    root = Path(data_dir)
    if root.exists():
        shutil.rmtree(root)
    log_dir = str(root / "logs")
    steps = [
        (
            f"write {count} records to demo-0 (lz4, batches of 100)",
            ["log", "write", log_dir, "--topic", "demo", "--partition", "0",
             "--count", str(count), "--batch", "100", "--compression", "lz4"],
        ),
        ("read the first records back", ["log", "read", log_dir, "--topic", "demo",
                                          "--partition", "0", "--from", "0", "--max", "5"]),
        ("describe the log directory", ["log", "describe", log_dir]),
    ]
    for title, args in steps:
        console.rule(f"[bold]{title}")
        console.print(f"$ tidelog {' '.join(args)}", style="dim")
        cli.main(args, prog_name="tidelog", standalone_mode=False)
    console.rule("[bold green]demo finished")
