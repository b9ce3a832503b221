"""The `tidelog` command. Subcommands live in their own modules and are imported on first use,
so that `tidelog --help` stays fast and one layer's import cost never taxes another's command."""

from __future__ import annotations

import importlib

import click

# name -> "module:attribute"; each layer registers its command here.
COMMANDS: dict[str, str] = {
    "log": "tidelog.cli.log_cmd:log",
    "demo": "tidelog.cli.demo:demo",
    "produce": "tidelog.cli.produce_cmd:produce",
    "consume": "tidelog.cli.consume_cmd:consume",
    "sim": "tidelog.cli.sim_cmd:sim",
    "cluster": "tidelog.cli.cluster_cmd:cluster",
    "topics": "tidelog.cli.topics_cmd:topics",
    "configs": "tidelog.cli.configs_cmd:configs",
    "reassign": "tidelog.cli.reassign_cmd:reassign",
    "server": "tidelog.cli.server_cmd:server",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tidelog")
def cli() -> None:
    """tidelog: a Kafka-compatible, replicated commit log."""


def main() -> None:
    cli(prog_name="tidelog")
