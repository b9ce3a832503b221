"""tests/compat runs every module against one Kafka and one tidelog cluster per session, so two
modules that create the same topic see each other's (TOPIC_ALREADY_EXISTS, or records left by
the other): each module's fixed topic names must be its own. Passing modules one at a time
hides a clash; the whole suite in one session shows it."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

COMPAT = Path(__file__).resolve().parents[1] / "compat"

# A fixed topic name (the suite's are lower case, which keeps out constants such as a Java
# class name): a TOPIC... constant, or a literal given to the suite's create helpers.
_TOPIC = re.compile(
    r'(?:\bTOPIC\w*\s*=\s*|\bcreate_ready\(\w+,\s*|\bcreate_topic\(\w+,\s*|\bNewTopic\()'
    r'"([a-z0-9._-]+)"')


def fixed_topics(source: str) -> set[str]:
    return set(_TOPIC.findall(source))


def test_the_pattern_finds_constants_and_create_calls() -> None:
    source = 'TOPIC = "a"\nTOPIC_B = "b"\ncreate_ready(t, "c", 1, 3)\nNewTopic("d", 1)\n' \
             'create_ready(t, f"e-{n}")\nTOPIC_COMMAND = "org.apache.kafka.tools.TopicCommand"\n'
    assert fixed_topics(source) == {"a", "b", "c", "d"}


def test_no_two_compat_modules_create_the_same_topic() -> None:
    owners: dict[str, set[str]] = defaultdict(set)
    for module in sorted(COMPAT.glob("*.py")):
        for topic in fixed_topics(module.read_text()):
            owners[topic].add(module.name)
    assert len(owners) > 20, "the pattern no longer finds the suite's topics"
    clashes = {t: sorted(m) for t, m in owners.items() if len(m) > 1}
    assert clashes == {}
