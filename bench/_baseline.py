"""tidelog at another git revision, for a before/after in the same benchmark run.

    from _baseline import baseline_source, tidelog_from   # bench scripts run from bench/
    src = baseline_source("HEAD without abc123", Path("/tmp/x"))
    with tidelog_from(src):
        cluster.up(3)   # the broker processes import tidelog from `src`
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def baseline_source(spec: str, into: Path) -> Path:
    """tidelog's `src` at git revision `spec`, exported into `into` (git archive: the shared
    repository is not touched) with its C accelerators built; returns the `src` dir.
    `REV without C1,C2` exports REV with the changes of commits C1 and C2 to src taken out
    again (one change measured against the same code otherwise)."""
    rev, _, without = spec.partition(" without ")
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    # (setup.py alone: the virtualenv's setuptools builds the extensions without the
    # packaging metadata of pyproject.toml)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src", "setup.py"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    for commit in reversed([c.strip() for c in without.split(",") if c.strip()]):
        diff = subprocess.run(["git", "-C", str(ROOT), "show", "--format=", commit, "--", "src"],
                              capture_output=True, check=True).stdout
        subprocess.run(["patch", "--quiet", "-R", "-p1", "-d", str(into)], input=diff, check=True)
    subprocess.run([sys.executable, "setup.py", "--quiet", "build_ext", "--build-lib", "src"],
                   cwd=into, check=True, capture_output=True)
    if not list((into / "src").rglob("_native_decoder*.so")):
        raise RuntimeError(f"the C accelerators of {spec} were not built")
    return into / "src"


@contextlib.contextmanager
def environment(**variables: str) -> Iterator[None]:
    """Processes started inside get these environment variables; this process's environment
    is as before afterwards."""
    saved = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def tidelog_from(src: Path | None) -> Iterator[None]:
    """Processes started inside import tidelog from `src` (PYTHONPATH comes before the
    virtualenv's editable install on sys.path); None: from this working tree."""
    with environment(**({} if src is None else {"PYTHONPATH": str(src)})):
        yield
