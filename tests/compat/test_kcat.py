"""kcat (librdkafka's command-line client): produce with keys, consume them back with their
offsets and keys, and list the topic's metadata, the same on Kafka and on tidelog."""

from __future__ import annotations

import json
import subprocess

import pytest
from differential import Pair, Target, create_ready

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def kcat(t: Target, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kcat", "-b", t.bootstrap, *args], input=input, capture_output=True,
                          text=True, timeout=60)


def test_kcat_produce_consume_and_list(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "kcat-topic", 2, 3)
        produced = kcat(t, "-P", "-t", "kcat-topic", "-K", ":", "-X", "acks=all",
                        input="".join(f"k{i}:v{i}\n" for i in range(10)))
        consumed = kcat(t, "-C", "-t", "kcat-topic", "-o", "beginning", "-e", "-q",
                        "-f", "%p %o %k %s\\n")
        listed = json.loads(kcat(t, "-L", "-t", "kcat-topic", "-J").stdout)
        (topic,) = listed["topics"]
        return (produced.returncode, consumed.returncode, sorted(consumed.stdout.splitlines()),
                topic["topic"], sorted((p["partition"], len(p["replicas"]), len(p["isrs"]))
                                       for p in topic["partitions"]), len(listed["brokers"]))

    got = pair.same(scenario)
    assert got[0] == 0 and len(got[2]) == 10
