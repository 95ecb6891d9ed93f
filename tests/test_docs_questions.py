"""The docs_questions benchmark's scoring (benchmarks/docs_questions.py): a named section is
found from the page's own headings, so code before and after a change is scored alike."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from tests.support.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def dq() -> ModuleType:
    return load_benchmark("docs_questions")


def test_a_named_section_runs_from_its_heading_to_the_next_of_its_level(dq: ModuleType) -> None:
    body = ("# Node.js 20 ChangeLog\n\n## 2023-07-18, Version 20.5.0\n\n### Notable Changes\n\n"
            "Shards.\n\n## 2023-07-05, Version 20.4.0\n\nMock timers.\n")
    start, end = dq.section_span(body, "Version 20.5.0")
    assert body[start:end].startswith("## 2023-07-18") and body[end:].startswith("## 2023-07-05")
    assert dq.section_span(body, "Version 20.4.0") == (body.index("## 2023-07-05"), len(body))
    assert dq.section_span(body, "Version 9.9.9") is None

    def served(*spans: tuple[str, int, int]) -> SimpleNamespace:
        return SimpleNamespace(evidence=[SimpleNamespace(source=SimpleNamespace(title=t),
                                                         char_start=s, char_end=e)
                                         for t, s, e in spans])

    shards, timers = body.index("Shards."), body.index("Mock timers.")
    res = served(("Other", 0, 10), ("Node.js 20 ChangeLog", timers, timers + 12),
                 ("Node.js 20 ChangeLog", shards, shards + 7))
    assert dq.position(res, "Node.js 20 ChangeLog") == 2  # any excerpt of the page
    assert dq.position(res, "Node.js 20 ChangeLog", (start, end)) == 3  # one in the section
    # An excerpt that starts before the section and runs into it holds its heading: it counts.
    assert dq.position(served(("Node.js 20 ChangeLog", 0, start + 5)),
                       "Node.js 20 ChangeLog", (start, end)) == 1
    assert dq.position(served(("Node.js 20 ChangeLog", 0, start)), "Node.js 20 ChangeLog",
                       (start, end)) is None


def test_question_files_load_with_or_without_sections(dq: ModuleType, tmp_path: Path) -> None:
    data = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
    for name in ("node_changelog_questions.json", "cmake_questions.json"):
        questions = dq.load_questions(data / name)
        assert len(questions) >= 18 and all(len(q) == 3 for q in questions)
    assert all(s and s.startswith("Version ") for _, _, s in dq.load_questions(
        data / "node_changelog_questions.json"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"questions": [{"question": "q"}]}))
    with pytest.raises(SystemExit, match="not a questions file"):
        dq.load_questions(bad)
