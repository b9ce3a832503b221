"""The layers of DESIGN.md, enforced: the core imports no shell, the shell no driver, and the
two drivers (the asyncio broker and the simulator) share the shell and never import each
other."""

from __future__ import annotations

import ast
import pathlib

import pytest

import tidelog

SRC = pathlib.Path(tidelog.__file__).parent


def imported_modules(package: str) -> dict[str, set[str]]:
    """module file -> every tidelog module it imports, at the top or inside a function."""
    out: dict[str, set[str]] = {}
    for path in sorted((SRC / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        out[str(path.relative_to(SRC))] = {n for n in names if n.startswith("tidelog.")}
    return out


def layer(module: str) -> str:
    return module.split(".")[1]


@pytest.mark.parametrize(("package", "allowed"), [
    # The pure core: storage and the wire format's record batches below it, nothing above.
    ("replication", {"replication", "storage", "protocol"}),
    # The shared shell: the core and storage (and tidelog/utils.py, Kafka's Utils, a leaf); no
    # transport, no driver.
    ("shell", {"shell", "replication", "storage", "protocol", "utils"}),
])
def test_a_lower_layer_imports_nothing_above_it(package: str, allowed: set[str]) -> None:
    found = imported_modules(package)
    assert found
    wrong = {f: sorted(m for m in mods if layer(m) not in allowed) for f, mods in found.items()}
    assert not any(wrong.values()), {f: m for f, m in wrong.items() if m}


@pytest.mark.parametrize(("driver", "other", "shell_user"), [
    ("broker", "sim", "broker/replica_manager.py"),
    ("sim", "broker", "sim/node.py"),
])
def test_the_drivers_share_the_shell_and_never_import_each_other(
    driver: str, other: str, shell_user: str
) -> None:
    found = imported_modules(driver)
    crossing = {f: sorted(m for m in mods if layer(m) == other) for f, mods in found.items()}
    assert not any(crossing.values()), {f: m for f, m in crossing.items() if m}
    assert "tidelog.shell.replica_manager" in found[shell_user]
