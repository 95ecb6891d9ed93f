"""How a document body is cut into chunks (``orchestrator.ingest.chunking``)."""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Any

import pytest

from orchestrator.ingest.chunking import chunk_text
from orchestrator.markdown import code_fences, enclosing, section_starts

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


def test_an_ordered_lists_marker_ends_no_sentence_for_an_overlap() -> None:
    """Node.js's commit-queue guide: a chunk opened with "Push the changes to nodejs/node",
    the rest of the list item "      1. Push the changes ..." whose marker's ". " read as a
    sentence end. The overlap starts at an item's line or at a real sentence end."""
    steps = "\n".join(f"   {i}. Run step number {i} of the landing without a full stop"
                      for i in range(1, 40))
    spans = chunk_text("Steps:\n" + steps, 300, 120)
    assert len(spans) > 3
    for c in spans[1:]:
        assert not c.text.startswith("Run step"), repr(c.text[:40])
        assert c.text.lstrip()[0].isdigit(), repr(c.text[:40])
    # A sentence end on an item's line still opens an overlap after it.
    items = "\n".join(f"{i}. Item {i} ends here. Then more words follow it" for i in range(1, 40))
    for c in chunk_text(items, 300, 120)[1:]:
        assert c.text.startswith(("Then", *(f"{i}. " for i in range(40)))), repr(c.text[:40])


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


# One long paragraph, wrapped as Markdown wraps it: every sentence runs over line breaks.
LONG_PARAGRAPH = "\n".join([
    "A receipt stores who asked, when, the hash of the question, the evidence and the",
    "hash of the rendered text; the database refuses evidence that is not the",
    "current version of a row the asker can see. It seals the receipt with a hash of",
    "its fields, chains it and keeps it append-only. The verifier re-derives the",
    "seal, checks the receipt row against its chain event and checks that each served",
    "version is a chained version of its row. It compares each with the row's current",
    "version: each evidence is unchanged, changed, deleted or unproven. A proven",
    "receipt is genuine; an ok one adds that nothing changed since it was sealed.",
] * 4)


def test_a_wrapped_paragraph_is_cut_at_sentence_ends_not_at_its_line_breaks() -> None:
    """docs/provenance.md's receipts paragraph: a chunk ended at a wrapped line ("... is not
    the") and the next opened "current version of a row the asker can see" (stop 50). A
    sentence end in the window's second half now ends the chunk, and the overlap opens at a
    sentence start, or the chunks touch."""
    spans = chunk_text(LONG_PARAGRAPH, 400, 120)
    assert len(spans) > 4
    for c in spans[:-1]:
        assert c.text.endswith("."), repr(c.text[-40:])
    for c in spans[1:]:
        assert LONG_PARAGRAPH[:c.start].rstrip().endswith("."), repr(c.text[:40])
        assert c.text[0].isupper(), repr(c.text[:40])
    # Without a sentence end in reach, a line break is still better than a word.
    no_stops = LONG_PARAGRAPH.replace(".", ",")
    for c in chunk_text(no_stops, 400, 0)[:-1]:
        assert no_stops[c.end:].startswith("\n"), repr(no_stops[c.end - 20:c.end + 20])


def test_a_block_line_ends_a_chunk_before_a_wrapped_line_does() -> None:
    """A line before a list item or a link reference definition ends a chunk as a sentence
    end does; the overlap opens at such a line."""
    items = "Steps for the release\n" + "\n".join(
        f"- step {i} runs the build and the tests on\n  every platform of the matrix"
        for i in range(30))
    spans = chunk_text(items, 300, 100)
    for c in spans[1:]:
        assert c.text.startswith("- step"), repr(c.text[:30])
    links = "See the guides.\n\n" + "\n".join(
        f"[guide {i}]: https://example.org/guides/{i}/a/long/path/to/the/page" for i in range(30))
    for c in chunk_text(links, 300, 100)[1:]:
        assert c.text.startswith("[guide "), repr(c.text[:30])


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


def test_neighbouring_excerpts_served_together_print_their_shared_text_once() -> None:
    import uuid

    from orchestrator.recall.result import Evidence, Provenance
    from orchestrator.recall.tail import trim_overlaps

    body = " ".join(f"Sentence {i} says something about the tides at the pier." for i in range(60))
    doc, other = uuid.uuid4(), uuid.uuid4()
    spans = chunk_text(body, 300, 120)
    assert all(b.start < a.end for a, b in pairwise(spans[:4])), "the chunks must overlap here"

    def excerpt(i: int, document: uuid.UUID = doc) -> Evidence:
        c = spans[i]
        return Evidence(text=c.text, provenance=Provenance.SOURCE_EXCERPT, scopes=(),
                        document_id=document, char_start=c.start, char_end=c.end)

    fact = Evidence(text=spans[1].text[:40], provenance=Provenance.DERIVED_MEMORY, scopes=(),
                    kind="fact", document_id=doc, char_start=spans[1].start,
                    char_end=spans[1].start + 40)
    served = [excerpt(1), excerpt(2), excerpt(0), fact, excerpt(1, other)]
    out = trim_overlaps(served)
    assert out[0] == served[0]  # the first is whole
    # The next starts where the first ends, the one before it ends where the first starts;
    # each is still the body's text at its offsets, and no text is printed twice.
    assert out[1].char_start >= spans[1].end and out[1].char_end == spans[2].end
    assert out[2].char_start == spans[0].start and out[2].char_end <= spans[1].start
    for e in out[:3]:
        assert body[e.char_start:e.char_end] == e.text and e.text.strip() == e.text
    ranges = sorted((e.char_start, e.char_end) for e in out[:3])
    assert all(a[1] <= b[0] for a, b in pairwise(ranges))
    # Nothing is lost: the three together still cover every character the chunks did.
    covered = {i for s, t in ranges for i in range(s, t)}
    assert all(i in covered for c in spans[:3] for i in range(c.start, c.end)
               if not body[i].isspace())
    # A fact and another document's excerpt are left as they are.
    assert out[3] == fact and out[4] == served[4]
    # Each item depends only on those before it: a prefix trims the same.
    assert trim_overlaps(served[:2]) == out[:2]


def _sections(n: int) -> str:
    """An API reference's shape: short sections, each a heading, prose and an example."""
    parts = []
    for i in range(n):
        parts.append(f"### `handle.method{i}(options)`\n\n"
                     f"Method {i} reads the handle and returns a promise. It fails when the "
                     f"handle is closed.\n\n```js\nconst r{i} = await handle.method{i}();\n"
                     f"# not a heading: a comment in the example\nconsole.log(r{i});\n```\n\n")
    return "".join(parts)


def _holds(body: str, spans: list[Any]) -> None:
    """Offsets hold, no chunk starts or ends blank, and no text is left out."""
    covered: set[int] = set()
    for i, c in enumerate(spans):
        assert c.ordinal == i and body[c.start:c.end] == c.text and c.text == c.text.strip()
        covered.update(range(c.start, c.end))
    assert all(i in covered for i, ch in enumerate(body) if not ch.isspace())


def test_a_chunk_ends_before_a_heading_and_the_next_opens_with_it() -> None:
    body = _sections(20)
    heads = section_starts(body)
    assert len(heads) == 20  # the "# not a heading" lines are inside code blocks
    spans = chunk_text(body, 600, 150)
    _holds(body, spans)
    for c in spans:
        assert c.start in heads and len(c.text) <= 600, c.text[:80]
        assert c.end in heads or c.end == len(body.rstrip()) or body[c.end:].lstrip().startswith("###")
    for a, b in pairwise(spans):  # sections: the next chunk starts where this one ends
        assert body[a.end:b.start].strip() == ""
    # Before: a chunk ended at the last paragraph break of its second half, so most chunks
    # opened with the end of the section before (an example, the prose under a heading).
    assert sum(c.text.startswith("###") for c in spans) == len(spans)


def test_a_chunk_that_goes_on_with_a_section_ends_with_it() -> None:
    """The Rust book's "What Is Ownership?": a chunk went on with "The Stack and the Heap",
    took in the short "### Ownership Rules" whole and ended before "### Variable Scope", so
    the rules were served as a chunk of the stack and heap (and the per-document cap put
    them 46th for "what are the ownership rules?"). A chunk that goes on with a section now
    ends before the first heading in its last two thirds; one that opens with a heading
    still packs whole short sections and ends before the last (an API reference's)."""
    long_section = " ".join(f"Sentence {i} of the stack and the heap." for i in range(40))
    body = ("### The Stack and the Heap\n\n" + long_section + "\n\n### Ownership Rules\n\n"
            "Each value has an owner. There is one owner at a time.\n\n### Variable Scope\n\n"
            + "A scope is the range within a program for which an item is valid. " * 30)
    spans = chunk_text(body, 1200, 150)
    _holds(body, spans)
    assert [c.text.split("\n")[0] for c in spans if c.text.startswith("###")] == [
        "### The Stack and the Heap", "### Ownership Rules"]
    rules = next(c for c in spans if c.text.startswith("### Ownership Rules"))
    assert "### Variable Scope" in rules.text  # opens a section: packs the short ones
    assert all("### Ownership Rules" not in c.text[1:] for c in spans)
    # A document that opens with text (a page's summary) packs its short sections as one that
    # opens with a heading: nothing of a chunk before goes on in it.
    intro = ("npm-ls lists installed packages. " * 12 + "\n\n### Synopsis\n\nnpm ls\n\n"
             "### Description\n\nThis command prints the tree.\n\n### Configuration\n\n"
             + "The depth option limits the tree. " * 40)
    first = chunk_text(intro, 1200, 150)[0]
    assert "### Description" in first.text and first.text.endswith("prints the tree.")


def test_a_code_block_is_not_cut_while_a_break_outside_it_is_in_reach() -> None:
    prose = "The handle reads the file. It returns a promise that settles later.\n\n"
    code = "```js\n" + "".join(f"const x{i} = await handle.read({i});\n" for i in range(8)) + "```\n\n"
    body = (prose * 3 + code) * 6
    fences = code_fences(body)
    for size, overlap in ((400, 0), (400, 120), (700, 150)):
        spans = chunk_text(body, size, overlap)
        _holds(body, spans)
        for c in spans:
            assert enclosing(c.start, fences) is None and enclosing(c.end, fences) is None, \
                (size, c.text[:60])


def test_a_code_block_longer_than_a_chunk_is_cut_at_its_lines() -> None:
    code = "```python\n" + "".join(f"value_{i} = compute({i})\n" for i in range(120)) + "```\n"
    body = "Some prose before the block.\n\n" + code + "\nAnd prose after it.\n"
    spans = chunk_text(body, 500, 100)
    _holds(body, spans)
    assert len(spans) >= 5 and all(len(c.text) <= 500 for c in spans)
    assert all(body[c.end] == "\n" for c in spans[:-1])  # at a line break, never mid-line


def test_section_starts_reads_atx_and_setext_headings_outside_code() -> None:
    body = ("Title\n=====\n\nIntro text.\n\n## Usage\n\nRun it.\n\n#hashtag is not one\n\n"
            "Options\n-------\n\n- an item\n---\n\n```sh\n# a comment\n```\n\n   ### Indented\n")
    starts = section_starts(body)
    assert [body[s:body.index("\n", s)].strip() for s in starts] == [
        "Title", "## Usage", "Options", "### Indented"]


def _changelog(n: int) -> str:
    """A changelog's shape (Node.js's): an anchor, a release's heading, then sub-headings
    and that release's entries (a different number per release, so cuts fall everywhere)."""
    parts = []
    for i in range(n, 0, -1):
        entries = "".join(f"* \\[[`{i:04x}{j:06x}`](https://example.org/c/{i}{j})] - **fs**: fix "
                          f"entry {j} of release {i} (Some One) [#{i}{j}](https://example.org/p/{i}{j})\n"
                          for j in range(i % 9 + 1))
        parts.append(f'<a id="1.{i}.0"></a>\n\n## 2023-07-{i:02d}, Version 1.{i}.0 (Current), @someone\n\n'
                     f"### Notable Changes\n\nRelease {i} fixes the file system.\n\n"
                     f"### Commits\n\n{entries}\n")
    return "".join(parts)


def test_a_heading_that_heads_only_headings_opens_the_chunk_it_heads() -> None:
    # Node.js's CHANGELOG_V20.md: a chunk ended with '<a id="20.5.0"></a>' and "## 2023-07-18,
    # Version 20.5.0": it was cut before "### Notable Changes", the last heading in reach, so
    # the release's number and date stood apart from every change it made.
    body = _changelog(40)
    for size in (500, 700, 900, 1200):
        spans = chunk_text(body, size, 150)
        _holds(body, spans)
        for c in spans:
            last = c.text.rstrip().splitlines()[-1]
            assert not last.startswith("#") and not last.startswith("<a id="), (size, c.text[-120:])
        for i in range(1, 41):  # each release's heading is in a chunk with its first section
            assert any(f"Version 1.{i}.0" in c.text and f"Release {i} fixes" in c.text
                       for c in spans), (size, i)


def test_section_trails_name_the_headings_a_chunk_starts_under() -> None:
    from orchestrator.markdown import extend_trail, section_trails

    body = ("# Node.js 20 ChangeLog\n\nIntro.\n\n"
            '<a id="20.5.0"></a>\n\n## 2023-07-18, Version 20.5.0 (Current)\n\n'
            "### Notable Changes\n\nShards for the test runner.\n\n```sh\n# not a heading\n```\n\n"
            "### Commits\n\n* fix a\n* fix b\n\n"
            "Setext Part\n-----------\n\nUnder a setext heading.\n")
    at = {name: body.index(name) for name in (
        "Intro.", '<a id="20.5.0">', "### Notable", "Shards", "```sh", "* fix b", "Under a")}
    names = list(at)
    trails = dict(zip(names, section_trails(body, [at[n] for n in names], "Node.js 20 ChangeLog"),
                      strict=True))
    assert trails["Intro."] == []  # under the title's heading only: the title says it already
    # The anchor and the release's heading open that chunk: its own heading is in its text.
    assert trails['<a id="20.5.0">'] == []
    assert trails["### Notable"] == [(2, "2023-07-18, Version 20.5.0 (Current)")]
    assert trails["Shards"] == [(2, "2023-07-18, Version 20.5.0 (Current)"), (3, "Notable Changes")]
    assert trails["```sh"] == trails["Shards"]  # "# not a heading" is code
    assert trails["* fix b"] == [(2, "2023-07-18, Version 20.5.0 (Current)"), (3, "Commits")]
    assert trails["Under a"] == [(2, "Setext Part")]  # a level-2 setext heading closes both
    # Under another title the first heading is a section of its own.
    assert section_trails(body, [at["Intro."]], "Release notes") == [[(1, "Node.js 20 ChangeLog")]]
    # A heading of quotes and control characters is kept short and printable: its trail's JSON
    # fits the column's check however its characters escape.
    odd = "# T\n\n" + "".join(f"{'#' * n} " + '"\\\x01' * 100 + "\n\ntext\n\n" for n in range(2, 7))
    deep = section_trails(odd, [len(odd) - 5], "T")[0]
    assert len(deep) == 5 and all(len(h) <= 200 and h.isprintable() for _, h in deep)
    import json

    assert len(json.dumps([{"level": n, "text": h} for n, h in deep])) <= 8000
    # Carried over a part of a chunk: the headings the skipped text held open and close.
    part = body[at["Shards"]:at["* fix b"]]
    assert extend_trail(trails["Shards"], part) == trails["* fix b"]


def test_a_setext_heading_that_heads_only_headings_opens_the_chunk_too() -> None:
    # The same run written with setext headings: "Version 1.i.0" over "=====" and nothing else
    # before "Notable Changes" over "-----".
    body = _changelog(40).replace("### Notable Changes", "Notable Changes\n---------------")
    body = re.sub(r"## (2023-07-\d\d, Version 1\.\d+\.0 \(Current\), @someone)",
                  lambda m: m.group(1) + "\n" + "=" * len(m.group(1)), body)
    assert "=====" in body and "## 2023" not in body
    for size in (500, 700, 900, 1200):
        spans = chunk_text(body, size, 150)
        _holds(body, spans)
        for c in spans:
            last = c.text.rstrip().splitlines()[-1]
            assert not set(last) <= set("=-") and "Version 1." not in last, (size, c.text[-120:])


def test_an_ordered_lists_marker_is_read_near_its_lines_start_only() -> None:
    from orchestrator.markdown import ordered_marker

    text = "Steps:\n   12. Run it. Then 3. is no marker\n" + "x" * 40 + " 7. late"
    assert ordered_marker(text, text.index("12.") + 2)
    assert not ordered_marker(text, text.index("it.") + 2)
    assert not ordered_marker(text, text.index("3.") + 1)  # words before it on its line
    assert ordered_marker("1. first", 1)  # the text's own first line
    # Past MARKER_REACH characters from its line's start nothing is a marker, so a long
    # line of sentences is read without looking back to its start each time.
    assert not ordered_marker(text, text.index("7.") + 1)
    assert not ordered_marker(" " * 40 + "5. item", 41)
