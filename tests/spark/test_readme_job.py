"""The README's Spark job, run as a newcomer runs it.

The job and its command line are taken from README.md's Spark section (so the README cannot
drift from what is tested) and run in a directory holding only ``job.py`` and the virtualenv,
from a shell whose PATH has no virtualenv and no PYSPARK_PYTHON: Spark's Python workers would
start ``python3`` from PATH, which lacks tidelog, unless ``tidelog.spark.register`` points them
at the job's interpreter. The job writes to a topic that does not exist yet: the sink asks the
broker to create it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

README = Path(__file__).resolve().parents[2] / "README.md"
TOPIC = "greetings"


def readme_spark_job() -> tuple[str, str]:
    """(job.py, the shell command that runs it) from README.md's ``### Spark`` section."""
    section = README.read_text().split("\n### Spark\n", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, re.S)
    job = [body for lang, body in blocks if lang == "python"]
    command = [body.strip() for lang, body in blocks if not lang and "job.py" in body]
    assert len(job) == 1 and len(command) == 1, "the README's Spark section changed shape"
    return job[0], command[0]


def shown_rows(stdout: str) -> list[list[str]]:
    """The rows of a DataFrame.show() table, its header first."""
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def without_virtualenv() -> dict[str, str]:
    venv_bin = str(Path(sys.prefix) / "bin")
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "PYSPARK_PYTHON",
            "PYSPARK_DRIVER_PYTHON",
            "VIRTUAL_ENV",
            "PYTHONPATH",
            "PYTHONHOME",
            "SPARK_LOCAL_IP",
        )
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != Path(venv_bin)
    )
    return env


def test_the_readme_spark_job_runs_as_written(broker, tmp_path: Path) -> None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime for Spark")
    job, command = readme_spark_job()
    (tmp_path / "job.py").write_text(job)
    (tmp_path / ".venv").symlink_to(sys.prefix)
    env = without_virtualenv()
    # The premise: the python3 a worker would get from PATH cannot import tidelog.
    premise = subprocess.run(
        ["bash", "-c", "python3 -c 'import tidelog'"], env=env, capture_output=True, cwd=tmp_path
    )
    assert premise.returncode != 0, "python3 on PATH imports tidelog: the test would prove nothing"
    meta = broker.run(broker.client.refresh_metadata([TOPIC]))
    if broker.cluster is not None:  # our own fresh cluster: the job's write creates the topic
        assert TOPIC not in meta.topics or meta.topics[TOPIC].error != 0

    env["B"] = broker.bootstrap
    proc = subprocess.run(
        ["bash", "-c", command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = shown_rows(proc.stdout)
    assert rows[0] == ["key", "value", "partition", "offset"]
    assert sorted((r[0], r[1]) for r in rows[1:]) == [
        ("k1", "again"),
        ("k1", "hello"),
        ("k2", "tidelog"),
    ]
    meta = broker.run(broker.client.refresh_metadata([TOPIC]))
    assert meta.topics[TOPIC].error == 0
