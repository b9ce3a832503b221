"""register(spark) chooses the interpreter of Spark's Python workers (the real job that needs
it, started without a virtualenv on PATH, is tests/spark/test_readme_job.py)."""

from __future__ import annotations

import pytest

from tidelog.spark import WorkerPythonError, worker_python

DRIVER = "/repo/.venv/bin/python"


def choose(
    master: str = "local[2]",
    context: str = "python3",
    conf: str | None = None,
    env: str | None = None,
) -> str:
    return worker_python(
        master=master,
        context_python=context,
        conf_python=conf,
        env_python=env,
        driver_python=DRIVER,
    )


def test_a_local_job_with_nothing_set_runs_its_workers_on_the_drivers_interpreter() -> None:
    assert choose() == DRIVER
    assert choose(master="local[*]") == DRIVER
    assert choose(master="local-cluster[2,1,1024]") == DRIVER


def test_spark_pyspark_python_wins_over_pyspark_python_as_in_spark() -> None:
    assert choose(conf="/opt/py/bin/python", env="/usr/bin/python3") == "/opt/py/bin/python"
    assert choose(env="/usr/bin/python3") == "/usr/bin/python3"
    assert choose(master="yarn", conf="/opt/py/bin/python") == "/opt/py/bin/python"


def test_an_interpreter_the_context_started_with_is_kept() -> None:
    # PYSPARK_PYTHON was set when the SparkContext started and removed since.
    assert choose(context="/opt/py/bin/python") == "/opt/py/bin/python"


def test_a_cluster_master_with_nothing_set_fails_with_what_to_set() -> None:
    with pytest.raises(WorkerPythonError) as failure:
        choose(master="spark://10.0.0.1:7077")
    message = str(failure.value)
    assert "\n" not in message
    assert "PYSPARK_PYTHON" in message and "spark.pyspark.python" in message
