"""Spark's own Kafka connector (``format("kafka")``, ``spark-sql-kafka-0-10``) for PySpark.

pip's pyspark ships without it. :func:`fetch` resolves it once from Maven Central with Spark's
own dependency resolver (``spark.jars.packages``, Ivy) into a cache directory and records the
jars pyspark does not already ship; :func:`jars` then lists them offline, for ``spark.jars``::

    python -m tidelog.spark.kafka_connector fetch      # once (network)
    SparkSession.builder.config("spark.jars", ",".join(kafka_connector.jars()))

The connector is taken at the installed pyspark's version when Maven Central has it, else at
the newest release before it (pyspark can be newer on PyPI than the connector on Maven).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["ConnectorUnavailable", "cache_dir", "candidate_versions", "fetch", "jars"]

GROUP, ARTIFACT = "org.apache.spark", "spark-sql-kafka-0-10_2.13"


class ConnectorUnavailable(RuntimeError):
    """The connector's jars are not in the cache and could not be fetched."""


def _release(version: str) -> tuple[int, ...] | None:
    """(4, 2, 0) for a release; None for previews, RCs and snapshots."""
    if not re.fullmatch(r"\d+(\.\d+)*", version):
        return None
    return tuple(int(p) for p in version.split("."))


def candidate_versions(pyspark_version: str) -> list[str]:
    """The connector revisions to ask Spark's resolver for, in order: the installed pyspark's
    own version, then the newest patch release (an Ivy ``+`` revision) of its minor version and
    of each earlier minor version of the same major one. pyspark can be newer on PyPI than the
    connector is on Maven."""
    mine = _release(pyspark_version.split("+")[0].split(".dev")[0])
    if mine is None or len(mine) < 2:
        raise ConnectorUnavailable(f"pyspark {pyspark_version} is not a release")
    major, minor = mine[0], mine[1]
    return [".".join(map(str, mine))] + [f"{major}.{m}.+" for m in range(minor, -1, -1)]


def cache_dir() -> Path:
    """``TIDELOG_SPARK_KAFKA_CACHE``, else ``~/.cache/tidelog/spark-kafka``."""
    env = os.environ.get("TIDELOG_SPARK_KAFKA_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tidelog" / "spark-kafka"


def _pyspark() -> tuple[str, Path]:
    import pyspark

    return pyspark.__version__, Path(pyspark.__file__).parent / "jars"


def _manifest(cache: Path) -> Path:
    return cache / f"pyspark-{_pyspark()[0]}.json"


def jars(cache: Path | None = None) -> list[str]:
    """The cached connector jars for the installed pyspark (no network)."""
    manifest = _manifest(cache or cache_dir())
    if not manifest.exists():
        raise ConnectorUnavailable(
            f"Spark's Kafka connector is not fetched ({manifest} missing): "
            f"run `{Path(sys.executable).name} -m tidelog.spark.kafka_connector fetch`"
        )
    paths = json.loads(manifest.read_text())["jars"]
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise ConnectorUnavailable(f"cached connector jars are gone: {missing[0]}; fetch again")
    return list(paths)


def connector_version(cache: Path | None = None) -> str:
    """The ``spark-sql-kafka-0-10`` version the cache holds for the installed pyspark."""
    jars(cache)
    return str(json.loads(_manifest(cache or cache_dir()).read_text())["connector"])


# Run in a child: Spark resolves spark.jars.packages when its JVM starts, once per process.
_RESOLVE = """
import sys
from pyspark.sql import SparkSession
coordinate, ivy = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local[1]")
         .config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.jars.packages", coordinate)
         .config("spark.jars.ivy", ivy)
         .getOrCreate())
spark.stop()
"""


def _resolve(coordinate: str, ivy: Path, timeout_s: float) -> str | None:
    """Resolve one coordinate into ``ivy`` in a child Spark; None on success, else why not."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run(
            [sys.executable, "-c", _RESOLVE, coordinate, str(ivy)],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s,
        )
    if done.returncode == 0:
        return None
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return " | ".join(tail)


def fetch(cache: Path | None = None, *, timeout_s: float = 600.0) -> list[str]:
    """Resolve the connector and its dependencies into the cache (once); returns :func:`jars`."""
    cache = cache or cache_dir()
    try:
        return jars(cache)
    except ConnectorUnavailable:
        pass
    pyspark_version, shipped = _pyspark()
    ivy = cache / "ivy"
    ivy.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    for revision in candidate_versions(pyspark_version):
        failure = _resolve(f"{GROUP}:{ARTIFACT}:{revision}", ivy, timeout_s)
        if failure is None:
            break
        failures.append(f"{revision}: {failure}")
    else:
        raise ConnectorUnavailable(f"no {ARTIFACT} resolved for pyspark {pyspark_version} "
                                   f"({'; '.join(failures)})")
    # Ivy names a jar group_artifact-version.jar; pyspark's own copy, artifact-version.jar, is
    # already on the classpath and stays the only one.
    own = {p.name for p in shipped.glob("*.jar")}
    needed = sorted(
        str(p) for p in (ivy / "jars").glob("*.jar") if p.name.split("_", 1)[-1] not in own
    )
    connector = [Path(p).name for p in needed if ARTIFACT in Path(p).name]
    if not connector:
        raise ConnectorUnavailable(f"{ARTIFACT}:{revision} resolved, but its jar is not in {ivy}")
    # The resolved revision, from the jar's name: org.apache.spark_<artifact>-<version>.jar.
    version = connector[0].split(f"{ARTIFACT}-", 1)[1].removesuffix(".jar")
    _manifest(cache).write_text(
        json.dumps({"pyspark": pyspark_version, "connector": version, "jars": needed}, indent=1)
    )
    return needed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["fetch"]:
        print("usage: python -m tidelog.spark.kafka_connector fetch", file=sys.stderr)
        return 2
    try:
        paths = fetch()
    except ConnectorUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{ARTIFACT} {connector_version()} for pyspark {_pyspark()[0]}:")
    for path in paths:
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
