"""The tidelog command: every registered subcommand loads and explains itself."""

import subprocess
import sys

import pytest
from click.testing import CliRunner

from tidelog.cli.main import COMMANDS, cli


def test_help_lists_every_registered_command() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        assert name in result.output


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_has_help(name: str) -> None:
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_unknown_command_is_a_clear_error() -> None:
    result = CliRunner().invoke(cli, ["no-such-command"])
    assert result.exit_code != 0
    assert "No such command" in result.output


def test_python_dash_m_runs_the_cli() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tidelog", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0
    assert "version" in out.stdout
