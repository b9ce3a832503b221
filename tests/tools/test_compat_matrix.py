"""tools/compat_matrix.py: docs/compatibility.md's matrix and differences are what tests/compat
tests, never written by hand."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("compat_matrix", REPO / "tools" / "compat_matrix.py")
assert _spec is not None and _spec.loader is not None
compat_matrix = importlib.util.module_from_spec(_spec)
sys.modules["compat_matrix"] = compat_matrix
_spec.loader.exec_module(compat_matrix)


@dataclass(frozen=True)
class Diff:
    what: str
    kafka: str
    tidelog: str
    why: str
    test: str


TESTS = [
    {"file": "tests/compat/test_kcat.py", "name": "test_kcat_lists", "module_doc": "kcat: all."},
    {"file": "tests/compat/test_kcat.py", "name": "test_kcat_differs", "module_doc": "kcat: all."},
]
DIFF = {"d": Diff("a|thing", "yes", "no", "because", "tests/compat/test_kcat.py::test_kcat_differs")}


def test_the_page_is_generated_from_the_suite() -> None:
    assert compat_matrix.main(["--check"]) == 0, "run python tools/compat_matrix.py"


def test_a_row_per_test_with_its_client_and_the_difference_it_asserts() -> None:
    page = compat_matrix.render(TESTS, DIFF)
    assert "| kcat (`test_kcat.py`) | kcat | kcat lists | same as Kafka |" in page
    assert "|  |  | kcat differs | differs: a\\|thing |" in page
    assert "| a\\|thing | yes | no | because | `test_kcat.py` |" in page


def test_a_failed_test_shows_as_failing() -> None:
    page = compat_matrix.render(TESTS, DIFF, failed={"tests/compat/test_kcat.py::test_kcat_lists"})
    assert "kcat lists | **fails** in the last run |" in page


def test_a_module_without_a_client_or_a_difference_without_its_test_is_refused() -> None:
    with pytest.raises(SystemExit, match="no client listed"):
        compat_matrix.render([{**TESTS[0], "file": "tests/compat/test_new.py"}], {})
    with pytest.raises(SystemExit, match="not a test of"):
        compat_matrix.render(TESTS[:1], DIFF)


def test_junit_failures_are_read_by_test_name(tmp_path: Path) -> None:
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.compat.test_kcat" name="test_kcat_lists[1]"><failure/></testcase>'
        '<testcase classname="tests.compat.test_kcat" name="test_kcat_differs"/>'
        '</testsuite></testsuites>')
    assert compat_matrix.junit_failures(report) == {"tests/compat/test_kcat.py::test_kcat_lists"}
