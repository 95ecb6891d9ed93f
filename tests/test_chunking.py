"""How a document body is cut into chunks (``orchestrator.ingest.chunking``)."""

from __future__ import annotations

from itertools import pairwise

import pytest

from orchestrator.ingest.chunking import chunk_text

WRAPPED = "\n".join([
    "The test runner reports a failure when a subtest is created after its parent",
    "finished. Asynchronous activity that outlives the test is marked as failed by",
    "the runner and reported as a diagnostic warning at the top level.",
    "",
    "In watch mode the runner watches test files and their dependencies and reruns",
    "the tests a change affects. It runs until the process is terminated; a second",
    "change while a run is under way queues one more run after it.",
    "",
]) * 6


def test_offsets_sizes_and_overlap_hold_for_every_chunk() -> None:
    spans = chunk_text(WRAPPED, 300, 80)
    assert len(spans) > 5
    for i, c in enumerate(spans):
        assert c.ordinal == i and WRAPPED[c.start:c.end] == c.text and len(c.text) <= 300
        assert c.text == c.text.strip()
    for a, b in pairwise(spans):
        assert a.start < b.start and a.end - b.start <= 80
        # Overlapping, or touching across whitespace (a chunk whose last sentence is longer
        # than the overlap window: the next starts at the next sentence), never a gap.
        assert WRAPPED[a.end:b.start].strip() == ""
    # Every character of the body outside whitespace is in some chunk.
    covered = set()
    for c in spans:
        covered.update(range(c.start, c.end))
    assert all(i in covered for i, ch in enumerate(WRAPPED) if not ch.isspace())


def test_an_overlap_starts_at_a_sentence_not_mid_line() -> None:
    # Markdown wraps paragraphs, so a line start is often mid-sentence: the overlap starts at
    # the first paragraph or sentence start in the window (before: at any word, e.g. "from a
    # completed test are marked...").
    for c in chunk_text(WRAPPED, 300, 120)[1:]:
        before = WRAPPED[:c.start].rstrip()
        assert before.endswith((".", "?", "!", ":")), repr(WRAPPED[c.start - 30:c.start + 30])
        assert c.text[0].isupper()


def test_without_a_sentence_start_the_overlap_falls_back_to_a_line_then_a_word() -> None:
    lines = "\n".join(f"item number {i} of the list without any full stop" for i in range(40))
    for c in chunk_text(lines, 200, 60)[1:]:
        assert lines[c.start - 1] == "\n"
    words = " ".join(f"word{i}" for i in range(300))
    spans = chunk_text(words, 200, 60)
    for c in spans[1:]:
        assert words[c.start - 1] == " " and c.text.startswith("word")
    assert spans[1].start < spans[0].end  # still an overlap
    # No overlap asked: consecutive chunks touch.
    spans = chunk_text(words, 200, 0)
    assert all(b.start == a.end + 1 for a, b in pairwise(spans))


def test_a_chunk_ends_at_a_paragraph_break_before_a_sentence_end() -> None:
    body = "First paragraph sentence one. Sentence two.\n\n" + "Second paragraph. " * 30
    first = chunk_text(body, 80, 0)[0]  # the break is past half the size
    assert first.text == "First paragraph sentence one. Sentence two."


@pytest.mark.parametrize(("size", "overlap", "message"), [
    (0, 0, "chunk size must be positive"),
    (100, 100, "overlap must be at least 0 and smaller than the chunk size"),
    (100, -1, "overlap must be at least 0"),
])
def test_bad_sizes_are_refused(size: int, overlap: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        chunk_text("text", size, overlap)
