"""KafkaJS (npm, the version interop/kafkajs/package-lock.json pins; `make interop` installs it)
through interop/kafkajs/harness.js, against Kafka and against tidelog: admin topics, partitions,
configs and records, an idempotent acks=-1 producer, a group consumer committing by hand, the
group's administration afterwards. Every line the harness prints must be the same on both."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from differential import Pair, Target

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HARNESS_DIR = Path(__file__).resolve().parents[2] / "interop" / "kafkajs"

# Every step the harness runs, in order: a step missing from its output (a crash) fails the test
# on both clusters alike, so the comparison alone would not notice it.
STEPS = [
    "admin connect",
    "describeCluster",
    "describeAcls",
    "createAcls",
    "deleteAcls",
    "createTopics",
    "createTopics existing",
    "createTopics replication factor 4",
    "createTopics invalid config",
    "createTopics replica assignment",
    "fetchTopicMetadata",
    "fetchTopicMetadata unknown topic",
    "listPartitionReassignments",
    "createPartitions to 3",
    "createPartitions to 2",
    "createPartitions unknown topic",
    "fetchTopicMetadata after createPartitions",
    "describeConfigs",
    "describeConfigs with synonyms",
    "describeConfigs unknown topic",
    "describeConfigs broker 1",
    "alterConfigs broker 1 validateOnly",
    "alterConfigs",
    "describeConfigs after alterConfigs",
    "alterConfigs validateOnly unknown key",
    "producer connect",
    "producer send acks -1",
    "producer disconnect",
    "fetchTopicOffsets",
    "fetchTopicOffsetsByTimestamp",
    "deleteRecords partition 0 before offset 2",
    "deleteRecords beyond the high watermark",
    "deleteRecords partition 2 to the high watermark (-1)",
    "fetchTopicOffsets after deleteRecords",
    "consumer connect",
    "consumer subscribe",
    "consumer consume and commit",
    "describeGroups while consuming",
    "deleteGroups while consuming",
    "setOffsets while consuming",
    "consumer disconnect",
    "describeGroups",
    "fetchOffsets",
    "fetchOffsets resolveOffsets",
    "setOffsets",
    "resetOffsets earliest",
    "fetchOffsets after resetOffsets",
    "listGroups",
    "deleteGroups",
    "deleteGroups unknown group",
    "deleteGroups again",
    "describeGroups after deleteGroups",
    "listGroups after deleteGroups",
    "createTopics for transactions",
    "transactional producer connect",
    "transaction send and commit",
    "transaction send and abort",
    "transaction sendOffsets and commit",
    "fetchOffsets of the transaction",
    "fetchTopicOffsets after the transactions",
    "read_committed consumer reads the committed records",
    "a second producer with the same transactional id",
    "the first producer is fenced",
    "transactional producers disconnect",
    "deleteTopics",
    "listTopics after deleteTopics",
    "deleteTopics unknown topic",
    "admin disconnect",
]


def kafkajs(t: Target) -> list[str]:
    node = shutil.which("node")
    assert node is not None, "node is not installed (scripts/install-debs.sh installs npm)"
    assert (HARNESS_DIR / "node_modules" / "kafkajs").is_dir(), "run `make interop` first"
    # Each step is bounded (45 s) inside the harness; this is the backstop for the whole run.
    r = subprocess.run([node, "harness.js", t.bootstrap], cwd=HARNESS_DIR, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, f"{t.name}: {r.stderr[-2000:]}"
    lines = r.stdout.splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == STEPS, f"{t.name}:\n{r.stdout}"
    return lines


def test_kafkajs_sees_the_same_on_tidelog_as_on_kafka(pair: Pair) -> None:
    on_kafka, on_tidelog = pair.run(kafkajs)
    differing = [f" kafka:   {k}\n tidelog: {t}" for k, t in zip(on_kafka, on_tidelog, strict=True)
                 if k != t]
    assert not differing, "tidelog differs from Kafka (KafkaJS):\n" + "\n".join(differing)
    # The harness exercised what it claims on the oracle itself, not a run of refusals.
    assert "createTopics: ok true" in on_kafka
    assert 'listPartitionReassignments: ok {"topics":[]}' in on_kafka
    assert "describeAcls: error KafkaJSProtocolError SECURITY_DISABLED(54)" in on_kafka
    assert "createTopics existing: ok false" in on_kafka
    assert "deleteRecords partition 0 before offset 2: ok null" in on_kafka
    assert any(line.startswith("consumer consume and commit: ok [") for line in on_kafka)
    assert 'describeGroups: ok [{"errorCode":0,"state":"Empty"' in "\n".join(on_kafka)
    # Transactions: only the committed records are read, the offsets sent in the transaction
    # are the group's, and the first producer is fenced by the second.
    assert ('read_committed consumer reads the committed records: ok [{"partition":0,"offset":"0",'
            '"value":"committed-1"},{"partition":1,"offset":"0","value":"committed-2"},'
            '{"partition":1,"offset":"2","value":"committed-3"}]') in on_kafka
    assert ('fetchOffsets of the transaction: ok [[{"partition":0,"offset":"1"},'
            '{"partition":1,"offset":"-1"}]]') in on_kafka
    assert ('the first producer is fenced: ok {"name":"KafkaJSProtocolError",'
            '"type":"INVALID_PRODUCER_EPOCH","retriable":false}') in on_kafka
