"""Quality gates of derived memory: code, URLs, markup, numbers and log lines are not knowledge.

The integration test ingests ``tests/fixtures/markdown`` (README, changelog, contributing
guide and notes of fictional software, with code blocks, badges, tables and logs) and runs
extraction, consolidation and profiles over it: no entity, profile or observation is junk,
the people and organisations of the prose are still found, and the sentence five
documents repeat is one observation however many entity pairs it co-mentions.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from orchestrator.cli.ingest import ingest_paths
from orchestrator.db.session import bound_session
from orchestrator.derive.consolidate import consolidate
from orchestrator.derive.extract import extract
from orchestrator.derive.profiles import refresh
from orchestrator.derive.quality import (
    junk_reason,
    mask_markup,
    plausible_entity,
    plausible_statement,
    sentence_as_written,
    statement_junk,
)

FIXTURE = Path(__file__).parent / "fixtures" / "markdown"


def test_masking_keeps_offsets_and_prose_and_removes_code_urls_tables_and_logs():
    body = (FIXTURE / "README.md").read_text()
    masked = mask_markup(body)
    assert len(masked) == len(body)
    start = body.index("Quillstream is a streaming document converter")
    assert masked[start:start + 60] == body[start:start + 60]
    for gone in ("pip install", "https://", "img.shields.io", "| `--workers`", "automake",
                 "quillstream.convert", "2026-03-14 09:12:44 INFO", "Mark-sweep"):
        assert gone not in masked, gone
    assert "the user guide" in masked  # link text stays, its target goes
    # MyST (Sphinx Markdown): a target line and a role are markup, the prose stays.
    myst = mask_markup("(repeatability)=\n# Repeatable Installs\n\nSee {ref}`pip download` here.")
    assert "repeatability" not in myst and "ref" not in myst and "pip" not in myst
    assert "Repeatable Installs" in myst and "See" in myst and "here." in myst
    # A template's expressions and tags are code (a Hugging Face card template named "More
    # Information Needed" 53 times); the prose around them stays.
    card = ('- **License:** {{ license | default("[More Information Needed]", true)}}\n'
            "{% if base_model %}Fine-tuned from {{ base_model }} by Ada Lovelace.{% endif %}")
    masked = mask_markup(card)
    assert len(masked) == len(card)
    assert "More" not in masked and "base_model" not in masked and "endif" not in masked
    assert "License" in masked and "Fine-tuned from" in masked and "Ada Lovelace." in masked
    # A setext heading's underline and a thematic break are markup, the heading stays.
    setext = mask_markup("Release notes\n=============\n\nText.\n\n---\n\nMore\n----\n")
    assert "=" not in setext and "-" not in setext and "Release notes" in setext and "More" in setext
    # Emphasis goes; an underscore between letters is none (the Rust book's "hello_cargo" read
    # "hello cargo" in a claim).
    assert mask_markup("Run target/debug/hello_cargo, _then_ __stop__ *now*.") == \
        "Run target/debug/hello_cargo,  then    stop    now ."


# Shapes that made a masking pattern scan the rest of the text from every position where it
# failed (each took 30 s to 8 minutes at 400 kB): a table (after its rows are masked, a log
# pattern's whitespace ran over every following line), unclosed images, link targets and
# <code> elements, and a long run of "1.1.1..." (an address's local part, looking for "@").
POISON_SHAPES = {"table": "|1|2|3|\n", "images": "![ ", "links": "](", "code": "<code>",
                 "dotted": "1.", "image_open": "![a](", "link_open": "[a](", "template": "{{",
                 "template_tag": "{% a ", "comment_open": "<!-- ", "comments": "<!-- a -->\n"}


def test_a_changelog_line_reads_without_escapes_autolink_brackets_or_spaced_punctuation():
    """Node's changelogs write "* \\[[`18862e4d5d`](...)] - **fs**: add ..." and end older
    lines with an autolink: claims read "\\ `18862e4d5d` - fs : add ..." and "(João Reis) <"."""
    lines = [
        "* \\[[`18862e4d5d`](https://github.com/nodejs/node/commit/18862e4d5d)] - "
        "**(SEMVER-MINOR)** **fs**: add `flush` option to `appendFile()` functions (Colin "
        "Ihrig) [#50095](https://github.com/nodejs/node/pull/50095)",
        "* \\[[`e07c86e240`](https://github.com/nodejs/node/commit/e07c86e240)] - build,win: try "
        "next MSVS version on failure (João Reis) <https://github.com/joyent/node/pull/25234>",
        "See [the guide](https://example.org/guide). Then run **make**, and *enjoy* \\*it\\*!",
    ]
    read = [" ".join(sentence_as_written(x, mask_markup(x), 0, len(x)).split()) for x in lines]
    assert read == [
        "`18862e4d5d` - (SEMVER-MINOR) fs: add `flush` option to `appendFile()` functions "
        "(Colin Ihrig) #50095",
        "`e07c86e240` - build,win: try next MSVS version on failure (João Reis)",
        "See the guide. Then run make, and enjoy it!",
    ], read
    # Read by the parser, each item is its own claim: no item's code joins the one above it.
    from orchestrator.derive.nlp import SpacyEntities, load_spacy, read

    items = "\n".join(lines[:2]) + "\n"
    masked = mask_markup(items)
    doc = load_spacy()(masked)
    said = [s.text for s in read(doc, SpacyEntities("x").mentions([masked], [doc])[0],
                                 original=items, context=masked)]
    assert len(said) == 2 and said[0].endswith("(Colin Ihrig) #50095"), said
    assert said[1].startswith("`e07c86e240`") and "18862e4d5d" not in said[1], said
    # A blank between two words still parts them; offsets never move.
    x = "Ask **Ada**about it"
    assert len(mask_markup(x)) == len(x)
    assert " ".join(sentence_as_written(x, mask_markup(x), 0, len(x)).split()) == "Ask Ada about it"


def test_a_sentence_of_the_name_alone_says_nothing_about_it():
    from orchestrator.derive.quality import says_more_than

    assert not says_more_than("Long Term Support", "Long Term Support")
    assert not says_more_than("[Long Term Support](#long-term-support).", "long term support")
    assert not says_more_than("Long Term Support (LTS)", "Long Term Support")
    assert says_more_than("Long Term Support (LTS) guarantees 30-month support cycles.",
                          "Long Term Support")
    assert says_more_than("Ada Lovelace wrote the first program.", "Ada Lovelace")


def test_masking_a_poisoned_document_does_not_hang():
    """Each shape, 200 kB of it, masked in a process of its own: all of them finish (in about
    a second together; the old patterns needed minutes, so the limit only catches a hang),
    keep their length, and prose after an unclosed element stays prose."""
    script = (
        "import json, sys\n"
        "from orchestrator.derive.quality import mask_markup\n"
        "shapes = json.loads(sys.argv[1])\n"
        "for name, unit in shapes.items():\n"
        "    body = unit * (200_000 // len(unit)) + ' Dana approves exceptions.'\n"
        "    out = mask_markup(body)\n"
        "    assert len(out) == len(body), name\n"
        "    assert out.endswith('Dana approves exceptions.'), name\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script, json.dumps(POISON_SHAPES)],
                          capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.parametrize(("name", "ok"), [
    ("Ada Lovelace", True), ("Lindqvist Labs", True), ("New York City", True), ("Node.js", True),
    ("Mark-sweep 130.6 (147.8)", False), ("Qard: [Qard](https://github.com/Qard)", False),
    ("readFile", False), ("os.path", False), ("quillstream==2.4.1", False), ("v1.2.3", False),
    ("--dpi`", False), ("&& make &&", False), ("README.md", False), ("12345", False),
    # A part of a document (the Rust book's "Listing 4-3" events, "Chapter 10" laws); a name
    # that opens with such a word, or a law's "Section 230", stays.
    ("Listing 4-3", False), ("Chapter 10", False), ("Fig. 2.1", False), ("Appendix B", False),
    ("Table IV", False), ("Section 3.2", False), ("Section 230", True), ("Table Mountain", True),
    ("Page Six", True),
])
def test_entity_names_must_read_as_names(name: str, ok: bool):
    assert plausible_entity(name) is ok


def test_statements_must_be_prose():
    assert plausible_statement("Lindqvist Labs maintains Quillstream in Oslo.")
    assert junk_reason("x = foo(bar);") == "code"
    assert junk_reason("see https://example.org/docs") == "url"
    assert junk_reason("2026-01-31 23:59:02 INFO migrating archive") == "log line"
    assert junk_reason("| engine | pages/s |") == "markup"
    assert junk_reason("130.6 147.8 98.2 96.4 Mark") == "numbers"
    # Prose has semicolons between clauses and dates in sentences (stop 36: both were junk,
    # so no observation or profile line could say them).
    assert junk_reason("Priya covers payments; Marco joins the rotation from December.") is None
    assert junk_reason("Go/no-go with Tomás Ortega on 2026-12-15.") is None
    assert junk_reason("Usually online 09:00-17:30 IST.") is None
    assert junk_reason("int a = 1;\nint b = 2;") == "code"
    assert junk_reason("for (;;) spin") == "code"
    assert junk_reason("2024-05-06 2024-05-07, 12:30") == "numbers"
    # Records: a passwd file or a PATH, read as one "sentence" (stop 51); a path or a date in
    # a sentence is prose.
    assert junk_reason("root:x:0:0:root:/root:/bin/bash daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/"
                       "nologin bin:x:2:2:bin:/bin:/usr/sbin/nologin") == "records"
    assert junk_reason("PATH /usr/local/bin:/usr/bin:/bin /opt/tools/bin") == "records"
    assert junk_reason("Engram keeps its logs under /var/log/engram for a week.") is None
    assert junk_reason("Ana and/or Marco review the finance/ops/legal budget every week.") is None
    # A plain-text table's row is markup to extraction; prose keeps its single (or double) spaces.
    row = "U+0110 Dcroat               1.3 (Sans, Sans Bold, Sans Bold Oblique, Sans Oblique)"
    assert mask_markup(row).strip() == "" and mask_markup("Name      Role").strip() == ""
    assert mask_markup("Ada met Bob.  Then they left.") == "Ada met Bob.  Then they left."


def test_ordinary_markdown_yields_no_junk_and_one_observation_per_sentence(
        tenant_factory, app_engine, settings):
    t = tenant_factory("docs")
    writer = t.identity("writer", write=("docs",))
    summary = ingest_paths(settings, app_engine, writer, [FIXTURE], collection="readme", scopes=["docs"])
    assert summary.files == 5 and not summary.failed
    with bound_session(app_engine, writer) as s:
        extract(s, settings=settings)
    with bound_session(app_engine, writer) as s:
        consolidate(s, settings=settings, min_evidence=2)
        refresh(s, settings=settings)
    with bound_session(app_engine, writer) as s:
        names = s.execute(text("select canonical_name from knowledge.entities")).scalars().all()
        profiles = s.execute(text("select summary from memory.profiles")).scalars().all()
        observations = s.execute(text("select text from memory.observations")).scalars().all()
    assert [n for n in names if not plausible_entity(n)] == []
    assert {"Maren Okafor", "Priya Raman", "Lindqvist Labs"} <= set(names)
    # Claims keep their inline code for the reader; the junk test masks it, as extraction did.
    assert profiles and all(statement_junk(p.partition(": ")[2]) is None for p in profiles)
    assert [o for o in observations if statement_junk(o)] == []
    # One sentence in five documents: a "maintains" claim and co-mentions of three entities,
    # so several groups of claims, which say the same thing: one observation.
    repeated = [o for o in observations if "Lindqvist Labs maintains Quillstream in Oslo" in o]
    assert len(repeated) == 1, observations


def test_a_claim_keeps_the_inline_code_of_its_sentence():
    """Extraction parses the masked text, but a claim's sentence reads as written: inline
    code back in its place (also at the sentence's start and end), while a fenced block, a
    URL and a table row stay out of it."""
    original = ("Intro line.\n"
                "The model is trained by `train_ranker.py` on LoCoMo dev, see https://x.org/a.\n"
                "`engram up` starts Engram; stop it with `engram db stop`\n"
                "```\nrun(`x`)\n```\n"
                "| `a` | b |\n")
    masked = mask_markup(original)
    first = masked.index("The model")
    sentence = sentence_as_written(original, masked, first, masked.index("dev,") + 4)
    assert sentence.strip() == "The model is trained by `train_ranker.py` on LoCoMo dev,"
    start = masked.index("starts")
    line_end = original.index("\n```")
    widened = " ".join(sentence_as_written(original, masked, start, line_end).split())
    assert widened == "`engram up` starts Engram; stop it with `engram db stop`"
    # Code after a full stop opens the next sentence; it is not also the end of this one.
    two = "Use `pip` here. `uv` is faster."
    two_masked = mask_markup(two)
    cut = two_masked.index(".") + 1
    assert sentence_as_written(two, two_masked, 0, cut).strip() == "Use `pip` here."
    assert " ".join(sentence_as_written(two, two_masked, cut + 1, len(two)).split()) == "`uv` is faster."
    # The fenced block's and the table row's code spans stay masked.
    block = sentence_as_written(original, masked, line_end + 1, len(original))
    assert "`" not in block and not block.strip()
    assert statement_junk("run `make test` before you push") is None
    # A code span that wraps over a line break is code too (not over a blank line).
    wrapped = "Start it with `engram up\n--port 8000` on a machine.\n\nA `tick and\n\nmore` here."
    wrapped_masked = mask_markup(wrapped)
    assert "engram up" not in wrapped_masked and "--port" not in wrapped_masked
    assert "tick and" in wrapped_masked and "more" in wrapped_masked
    assert " ".join(sentence_as_written(wrapped, wrapped_masked, 0, wrapped.index("\n\n")).split()) \
        == "Start it with `engram up --port 8000` on a machine."
    assert plausible_statement("Engram is started by `engram up` on a fresh machine.")


def test_a_name_never_runs_over_two_markdown_blocks():
    """The parser reads a table of contents, or a heading and the line under it, as one run
    of words; a name or a sentence found over such a line break is none ("Upgrading Upgrading
    with", "License The MIT License", a contents list as one sentence), while a name a
    wrapped paragraph carries to its next line is one."""
    from orchestrator.derive.nlp import SpacyEntities, crosses_block, load_spacy, read

    toc = "* [Upgrading](#upgrading)\n  * [Upgrading with Homebrew](#upgrading-with-homebrew)\n"
    assert crosses_block(toc, toc.index("Upgrading"), toc.index(" with"))
    assert crosses_block("### License\n\nThe MIT License", 4, 27)
    assert crosses_block("## Ada\nLovelace wrote it.", 3, 15)
    wrapped = "The engine was designed by Ada\nLovelace in 1843."
    assert not crosses_block(wrapped, wrapped.index("Ada"), wrapped.index(" in"))

    body = ("## Contents\n\n"
            "* [Understanding Python version selection](#selection)\n"
            "  * [Locating Quillstream-provided Python Installations](#locating)\n"
            "* [Advanced Configuration](#advanced)\n\n"
            "### Version History\n\nSee [CHANGELOG.md](CHANGELOG.md).\n\n\n"
            "### License\n\n[The MIT License](LICENSE)\n\n"
            "The engine was designed by Ada\nLovelace and Charles Babbage in London.\n")
    masked = mask_markup(body)
    doc = load_spacy()(masked)
    sentences = read(doc, SpacyEntities("x").mentions([masked], [doc])[0], original=body)
    names = {e.name for s in sentences for e in s.entities}
    assert {"Ada Lovelace", "Charles Babbage", "London"} <= names, names
    # The old reading named "License The MIT License" (a heading run into the next paragraph);
    # since rules 11 the part below the heading is the name (its article stripped).
    assert not [n for n in names if n.startswith(("License", "The")) or "History" in n], names

    # An abbreviation that opens the sentence is not part of the name after it.
    text = "Plugins may run more steps on uninstall. E.g. Pyenv-Virtualenv also removes them.\n"
    doc = load_spacy()(text)
    found = {e.name for s in read(doc, SpacyEntities("x").mentions([text], [doc])[0]) for e in s.entities}
    assert "Pyenv-Virtualenv" in found and not [n for n in found if n.lower().startswith("e.g")]

    # A table of contents is one line per item, not one sentence naming every entity in it.
    toc = ("## Table of Contents\n\n"
           "* **[Installation](#installation)**\n  * [Getting Quillstream](#getting)\n"
           "    * [Automatic Installer](#auto)\n    * [Basic GitHub Checkout](#checkout)\n"
           "  * [Install Python build dependencies](#deps)\n"
           "* **[Usage](#usage)**\n  * [Uninstall Python versions](#uninstall)\n"
           "* [Upgrading](#upgrading)\n  * [Upgrading with Homebrew](#brew)\n"
           "  * [Upgrading with Installer or Git checkout](#git)\n")
    masked = mask_markup(toc)
    doc = load_spacy()(masked)
    texts = [s.text for s in read(doc, SpacyEntities("x").mentions([masked], [doc])[0],
                                  original=toc)]
    assert texts and all("\n" not in t and t in toc for t in texts), texts


def test_an_ordinary_word_that_opens_a_sentence_is_not_a_name():
    """API references open sentences with capitalised verbs and nouns, which the small NER
    model types as people ("Listens", "Spawns", "Bugs", "Terminating", "Types": profiles
    of them were served). A one-word name is kept where the document never writes it in
    lower case, or capitalises it inside a sentence ("developing Cargo itself", although
    it also says "use cargo"); acronyms and inner capitals are kept, and so is a speaker's
    name before a colon, which the tagger reads as a common noun."""
    from orchestrator.derive.nlp import SpacyEntities, load_spacy, read

    text = ("## emitter.once(eventName, listener)\n\n"
            "Listens once to the abort event on the provided signal. Returns a disposable.\n\n"
            "An emitter listens for events until it is closed.\n\n"
            "## child_process.exec(command)\n\n"
            "Spawns a shell then executes the command within that shell, buffering any output. "
            "The exec function spawns a shell by default.\n\n"
            "Bugs should be reported to the GNOME issue tracker. Report bugs early.\n\n"
            "Terminating is now a fully asynchronous operation; a worker keeps terminating.\n\n"
            "To start developing Cargo itself, read the guide written by Ada Lovelace on GitHub. "
            "Cargo builds with LLVM. Use cargo to build.\n\n"
            "Types of streams are listed below; all types share one base class.\n")
    doc = load_spacy()(text)
    mentions = SpacyEntities("x").mentions([text], [doc])[0]
    typed = {text[m.start:m.end] for m in mentions}
    assert {"Listens", "Spawns", "Bugs", "Terminating", "Types"} <= typed  # what NER says
    found = {e.name for s in read(doc, mentions, context=text) for e in s.entities}
    assert found == {"Ada Lovelace", "Cargo", "GNOME", "GitHub", "LLVM"}, found
    # Without the document (only the chunk), the chunk's own words decide.
    assert "Listens" not in {e.name for s in read(doc, mentions) for e in s.entities}
    # A conversation turn: the speaker's name opens it and is never written in lower case.
    turn = "Joanna: Woohoo, Nate! I finished my first screenplay and printed it last Friday."
    doc = load_spacy()(turn)
    named = {e.name for s in read(doc, SpacyEntities("x").mentions([turn], [doc])[0], context=turn)
             for e in s.entities}
    assert "Joanna" in named, named
    # A person is never written all in lower case.
    notes = "Don't try to recover keyword as non-keyword identifier, fixing an ICE. Ask max."
    doc = load_spacy()(notes)
    mentioned = SpacyEntities("x").mentions([notes], [doc])[0]
    assert {notes[m.start:m.end] for m in mentioned if m.entity_type == "person"} == \
        {"non-keyword", "max"}
    assert not {e.name for s in read(doc, mentioned, context=notes) for e in s.entities}
    # A word the tagger reads as a verb or adjective is no name, wherever it stands ("On the
    # Stable toolchain" and "Nightly" were a person and a place); nationalities stay.
    notes = ("### On the Stable toolchain\n\nUse the stable compiler for releases.\n\n"
             "### On the Nightly toolchain\n\nNightly features may change.\n\n"
             "Learn more in the guide by Ada Lovelace. French and Korean translations ship.\n")
    doc = load_spacy()(notes)
    mentioned = SpacyEntities("x").mentions([notes], [doc])[0]
    assert {"Stable", "Nightly"} <= {notes[m.start:m.end] for m in mentioned}
    assert {e.name for s in read(doc, mentioned, context=notes) for e in s.entities} == \
        {"Ada Lovelace", "French", "Korean"}
    # The gates off read every mention as before.
    doc = load_spacy()(text)
    ungated = {e.name for s in read(doc, mentions, gates=False) for e in s.entities}
    assert {"Listens", "Spawns", "Types"} <= ungated


def _parsed(body: str) -> tuple[str, Any, list[Any]]:
    """``body`` masked as extraction masks it, parsed by the packaged pipeline, and the
    mentions its NER finds: what ``nlp.read`` is given."""
    from orchestrator.derive.nlp import SpacyEntities, load_spacy

    text = mask_markup(body)
    doc = load_spacy()(text)
    return text, doc, SpacyEntities("x").mentions([text], [doc])[0]


def _weak_names(body: str, tagged: set[str]) -> dict[str, bool]:
    """Each entity ``nlp.read`` finds in ``body`` -> whether every mention of it is weak,
    once the NER is seen to have tagged ``tagged`` (else the test would prove nothing)."""
    from orchestrator.derive.nlp import read

    text, doc, mentions = _parsed(body)
    typed = {text[m.start:m.end]: m.entity_type for m in mentions}
    assert tagged <= typed.keys(), typed
    found: dict[str, bool] = {}
    for s in read(doc, mentions, original=body, context=text):
        for e in s.entities:
            found[e.name] = found.get(e.name, True) and e.weak
    return found


def test_a_command_a_shout_or_a_lower_case_word_is_not_a_name():
    """Release notes and headings open lines with commands and gerunds that NER reads as part
    of a name ("Fix MacPorts", "Running Rustfmt", "D. Install Python": profiles of them were
    served); the name is what follows. Names that are verbs too ("Mark", "Frank") stay, in
    their sentence the tagger reads them as names. A licence's shouted disclaimer is no list
    of organisations ("EXPRESS", "DAMAGES", "LIABILITY"), acronyms in ordinary sentences
    (API, MIT, NVIDIA) are kept, and an organisation or place is never all lower case
    ("stdin"). A one-word heading the prose never capitalises mid-sentence is a section's
    label ("# Changelog" was a place); Homebrew, named in a sentence, stays."""
    from orchestrator.derive.nlp import read

    body = ("# Changelog\n\n"
            "* Add GraalPy 25.0.2 by @msimacek in https://github.com/pyenv/pyenv/pull/3395\n"
            "* Fix MacPorts OpenSSL formula detection by @tekintian\n"
            "* Drop the old flag.\n\n"
            "## Running Rustfmt from your editor\n\n"
            "### D. Install Python build dependencies\n\n"
            "Mark Smith reviewed the patch. Frank Mata wrote the docs for Homebrew.\n\n"
            "Read the input from stdin and hand it to node.\n\n"
            "The API runs on NVIDIA GPUs; the code is under the MIT license.\n\n"
            "THE SOFTWARE IS PROVIDED AS IS, WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED. "
            "IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES "
            "OR OTHER LIABILITY.\n")
    text, doc, mentions = _parsed(body)
    junk = {"Fix MacPorts", "Running Rustfmt", "D. Install Python", "EXPRESS",
            "DAMAGES", "LIABILITY", "SOFTWARE", "stdin", "Changelog"}
    assert junk <= {text[m.start:m.end] for m in mentions}  # what NER says
    found = {e.name for s in read(doc, mentions, original=body, context=text) for e in s.entities}
    assert not found & junk, found & junk
    assert {"MacPorts", "Rustfmt", "Python", "Mark Smith", "Frank Mata", "Homebrew", "API",
            "MIT"} <= found, found
    # The gates off keep every mention as NER typed it.
    ungated = {e.name for s in read(doc, mentions, gates=False) for e in s.entities}
    assert {"Fix MacPorts", "EXPRESS", "stdin"} <= ungated


def test_a_command_after_a_component_label_or_an_abbreviation_is_not_part_of_a_name():
    """pyenv's changelog writes "* python-build: Add Jython 2.7.2": the parser starts no
    sentence after the component's colon, so "Add Jython" and "Prefer Homebrew" were people
    with profiles (stop 44); the name is what follows the command, or a past ("Configured
    GCC"), or a verb undone ("Uninstall Python versions", a heading). A label in title case is
    no component ("Reviewer: Mark Twain" keeps its name), and names ending in -ed are names.
    Lower-case letters with full stops abbreviate a phrase ("e. g." was a person of undici's
    docs)."""
    from orchestrator.derive.nlp import read

    body = ("* python-build: Add Jython 2.7.2 (#1672)\n"
            "* python-build: Prefer Homebrew's OpenSSL 1.1 over 1.0 (#839, #1302)\n"
            "* python-build: Add Pyston 0.6.1 (#859)\n"
            "* python-build: Configured GCC as a requirement to build CPython (#613)\n\n"
            "### Uninstall Python versions\n\n"
            "Reviewer: Mark Twain wrote it. Fred Smith and Ted Reed reviewed it.\n\n"
            "headers - Note that all keys are lower-cased, e. g. `content-type`.\n")
    text, doc, mentions = _parsed(body)
    said = {" ".join(text[m.start:m.end].split()) for m in mentions}
    junk = {"Add Jython", "Prefer Homebrew", "Add Pyston", "e. g.", "Configured GCC",
            "Uninstall Python"}
    assert {"Add Jython", "Add Pyston", "e. g.", "Configured GCC", "Uninstall Python"} <= said, said
    found = {e.name for s in read(doc, mentions, original=body, context=text) for e in s.entities}
    assert not found & junk, found & junk
    assert {"Jython", "Homebrew", "Pyston", "GCC", "Mark Twain", "Fred Smith",
            "Ted Reed"} <= found, found


def _types(body: str) -> tuple[dict[str, str], dict[str, str]]:
    """(what the NER tagged in ``body``, name -> type; what ``nlp.read`` makes of it, entity
    name -> type)."""
    from orchestrator.derive.nlp import read

    text, doc, mentions = _parsed(body)
    tagged = {" ".join(text[m.start:m.end].split()): m.entity_type for m in mentions}
    return tagged, {e.name: e.entity_type
                    for s in read(doc, mentions, original=body, context=text) for e in s.entities}


def test_a_person_the_document_writes_in_lower_case_is_software():
    """pyenv's changelog has "Jython" as a person (and "Pyston", "Ubuntu", "Zsh": each got a
    person's profile of release notes, stop 44) and writes "jython-2.7.2": no person's name
    is written in lower case on its own. A handle, an address or a path is no such writing
    ("@priya", "priya@acme.com", "notes/priya/todo.md"), so Priya stays a person."""
    tagged, found = _types(
        "* python-build: Add Jython 2.7.4 by @cesarcoatl (#3290)\n"
        "* Build jython-2.7.2 with the new JDK.\n\n"
        "Priya Raman met Priya on Monday. Priya wrote to priya@acme.com and @priya; her "
        "notes are in notes/priya/todo.md.\n")
    assert tagged.get("Add Jython") == "person" and tagged.get("Priya") == "person", tagged
    assert found.get("Jython") == "product", found
    assert found.get("Priya") == "person" and found.get("Priya Raman") == "person", found


def test_a_person_of_english_words_without_a_common_name_is_a_product():
    """All 34 "people" of Node.js's contributor guides were capitalised phrases of English
    ("Long Term Support", "Release Schedule", "Tips", "Zoom"), each with a person's profile
    (stop 45). A name of English words is a person only where a common given name opens it,
    a common surname ends it, or a title or kin word opens it; a one-word noun alone only
    where its document never writes it in lower case (WordNet has "tolkien" and "plato")."""
    from orchestrator.derive.nlp import _english_only, load_spacy, typed_by_rules

    tagged, found = _types(
        "## Releases\n\n"
        "Careful consideration of what goes into Long Term Support (LTS) releases. Long "
        "Term Support guarantees 30-month support cycles for every even release line.\n\n"
        "Grant Hill reviewed the release with Mark Twain and Maren Okafor. Will said the "
        "notes are ready.\n")
    assert tagged.get("Long Term Support") == "person" and tagged.get("Will") == "person", tagged
    assert found.get("Long Term Support") == "product", found
    for name in ("Grant Hill", "Mark Twain", "Maren Okafor", "Will"):
        assert found.get(name) == "person", (name, found)

    nlp = load_spacy()
    context = "the maintenance of a module; tips for the release schedule"
    for name in ("Style Guide", "Release Schedule", "Event Tracing", "Command Line Interface",
                 "Pre-Release Announcement", "Approval Workflow", "Tips", "Zoom", "Chrome",
                 "Promise", "Maintenance", "Module", "Advocacy", "Basics"):
        assert _english_only(name, context, nlp), name
    for name in ("Grant Hill", "Mark Twain", "Bill Gates", "Hope Solo", "Will", "Frost",
                 "Rose", "Smith", "Trump", "Grandma", "King Charles", "Aunt May",
                 "J. R. R. Tolkien", "Tolkien", "Plato", "Ada Lovelace", "Priya", "Maren Okafor",
                 "Long Nguyen", "Mary-Jane O'Neil", "Appendix", "Prudence", "Trinity"):
        assert not _english_only(name, context, nlp), name
    # A common surname alone is a word where its document writes it in lower case (pyenv's
    # docs: "bash"), and a name elsewhere.
    assert _english_only("Bash", "run it in bash or zsh", nlp)
    assert not _english_only("Bash", context, nlp)
    assert not _english_only("Will", "it will run", nlp)  # a common given name stays one
    # Without its document (an entity an older rule typed), a phrase is retyped, a one-word
    # noun only by its ending.
    assert typed_by_rules("Long Term Support", "person") == "product"
    assert typed_by_rules("Maintenance", "person") == "product"  # an abstraction's ending
    assert typed_by_rules("Dispatcher", "person") == "person"
    assert typed_by_rules("Grant Hill", "person") == "person"
    assert typed_by_rules("Long Term Support", "organization") == "organization"
    # Two English words written as one count in a name of two words or more (undici's
    # "Client Lifecycle" was a person, stop 50); a surname so written stays a name after a
    # given name, and a one-word name is never read as two.
    for name in ("Client Lifecycle", "Release Timestamp", "Shared Codebase"):
        assert _english_only(name, context, nlp), name
    for name in ("Ann Goldman", "Tom Blackwell", "Alan Woodward", "Goldman", "Lifecycle"):
        assert not _english_only(name, context, nlp), name


def test_a_comment_a_dash_a_verb_inside_or_shorthand_is_not_part_of_a_name():
    """API references keep their change history in HTML comments ("<!-- YAML changes: ...
    description: ... -->"), glossaries write "TERM - Expansion - definition", and NER runs a
    name on into the verb or preposition after it ("Node.js supports", "Node.js via",
    "Windows is Experimental"). Chat shorthand (WIP, LGTM) and a date format's placeholder
    (YYYY) name nothing. Each of these was an entity of a folder of Node.js docs (stop 34)."""
    from orchestrator.derive.nlp import SpacyEntities, _lemma_index, _verb_form, load_spacy, read

    body = ("# Timers\n\n"
            "<!-- YAML\nchanges:\n  - version: v6.8.0\n"
            "    description: On Windows, the Node.js Permission Model now covers UNC paths.\n-->\n\n"
            "This will build Node.js first (if necessary) and then use it to build the docs.\n"
            "Node.js supports FIPS when linked with OpenSSL 3 via the shared library.\n"
            "Furthermore, compiling on x86 Windows is Experimental and may break.\n\n"
            "* TSC - Technical Steering Committee - Governing body of the project.\n\n"
            "LGTM, thanks! AFAIK the WIP label stays until Ada Lovelace approves.\n\n"
            "Dates are written as YYYY in the changelog kept by Grace Hopper.\n")
    nlp = load_spacy()
    # What NER says over the text unmasked and masked: the comment's names, and the rest.
    raw_doc = nlp(body)
    assert {"UNC", "the Node.js Permission Model"} <= {
        body[m.start:m.end] for m in SpacyEntities("x").mentions([body], [raw_doc])[0]}
    text = mask_markup(body)
    assert "v6.8.0" not in text and "Permission Model" not in text and "Node.js first" in text
    doc = nlp(text)
    mentions = SpacyEntities("x").mentions([text], [doc])[0]
    junk = {"Node.js first", "Node.js supports", "Windows is Experimental",
            "TSC - Technical Steering Committee - Governing", "WIP", "YYYY"}
    assert junk <= {text[m.start:m.end] for m in mentions}
    found = {e.name for s in read(doc, mentions, original=body, context=text) for e in s.entities}
    assert {"Node.js", "Windows", "TSC", "Ada Lovelace", "Grace Hopper"} <= found, found
    assert not found & (junk | {"UNC", "Node.js Permission Model", "LGTM", "AFAIK"}), found
    # A verb in the third person is a verb form, as its base and -ing forms are.
    verbs = _lemma_index(nlp, "verb")
    assert all(_verb_form(w, verbs) for w in ("Cancels", "applies", "pushes", "Returns"))
    assert not any(_verb_form(w, verbs) for w in ("Jones", "Rogers", "Evans"))



def test_a_unit_after_its_quantity_is_no_name():
    """An engineering note's "alert when the slot lags > 10 GB" made "GB" a place and a
    product (stop 35); a unit or a currency code after a number names nothing, and the
    same letters alone may still be a name."""
    from orchestrator.derive.nlp import SpacyEntities, _unit, load_spacy, read

    nlp = load_spacy()
    body = ("Priya Raman set the alert at 10 GB of slot lag and pages at 30 GB.\n\n"
            "Refunds total 18412 EUR, Marco Rossi says.\n")
    doc = nlp(body)
    mentions = SpacyEntities("x").mentions([body], [doc])[0]
    assert {"GB", "EUR"} <= {body[m.start:m.end] for m in mentions}  # what NER says
    found = {e.name for s in read(doc, mentions, original=body, context=body) for e in s.entities}
    assert {"Priya Raman", "Marco Rossi"} <= found, found
    assert not found & {"GB", "EUR"}, found
    units = nlp("The 10 GB disk. GB won the match. EUR rates rose.")
    assert _unit(units[2:3]) and not _unit(units[5:6]) and not _unit(units[10:11])


def test_a_name_the_parser_ran_a_heading_into_is_the_part_below_it():
    """Meeting notes: "## Discussion" over "- Lena asked whether ..." was read as one name
    "Discussion\n  Lena" and dropped whole (a name never runs over two blocks), so the one
    sentence that says what Lena did named no one; a done task's "[x]" stayed in the
    sentence ("x Tomás: get security sign-off"), and a label was cut from its line ("Lena:",
    stop 35)."""
    from orchestrator.derive.nlp import SpacyEntities, load_spacy, read

    body = ("## Context\nNightly export is 26h stale by the time analysts read it. Finance "
            "closes the month on stale numbers.\n\n## Discussion\n- Lena asked whether logical "
            "replication adds load on the primary.\n\n"
            "## Action items\n- [ ] Priya: staging deployment by week 45\n"
            "- [ ] Lena: BigQuery dataset and service account\n"
            "- [x] Tomás: get security sign-off for the replication user\n")
    text = mask_markup(body)
    assert "[x]" not in text and " x " not in text
    doc = load_spacy()(text)
    mentions = SpacyEntities("x").mentions([text], [doc])[0]
    assert "Discussion\n  Lena" in {text[m.start:m.end] for m in mentions}  # what NER says
    said = {s.text: [e.name for e in s.entities]
            for s in read(doc, mentions, original=body, context=text)}
    assert said["Lena asked whether logical replication adds load on the primary."] == ["Lena"]
    assert said["Tomás: get security sign-off for the replication user"] == ["Tomás"], said
    # The parser cut "Lena:" from the rest of its line: a label and its line are one sentence.
    assert said["Lena: BigQuery dataset and service account"] == ["Lena"], said
    assert "Lena:" not in said
    # A label over a block of code is no label of the sentence after the block.
    body = ("On Windows:\n\n```js\n'foo\\\\bar'.split(path.sep);\n```\n\n"
            "On Windows, both the forward slash and the backward slash are accepted.\n")
    text = mask_markup(body)
    doc = load_spacy()(text)
    said = [s.text for s in read(doc, SpacyEntities("x").mentions([text], [doc])[0],
                                 original=body, context=text)]
    assert said and not [t for t in said if t.startswith("On Windows: On Windows")], said


def test_a_heading_of_ordinary_words_or_an_adjective_by_its_place_names_only_a_known_entity():
    """npm's docs (rules 14): section headings of ordinary words ("### Token Behavior",
    "#### Audit Signatures") were people and organisations, and "Valid values for ..." made
    a group "Valid" of 40 claims. Such mentions are weak (they name an entity only where
    one is known); names in headings, nationalities and speakers stay names."""
    from orchestrator.derive.nlp import read

    body = ("### Token Behavior\n\nIn order to avoid processing the node_modules folder "
            "repeatedly, npm caches the token and its behavior.\n\n"
            "#### Audit Signatures\n\nTo verify audit signatures, npm reads the registry "
            "signatures of each package.\n\n"
            "Valid values for the workspace config are either a name or a path.\n\n"
            "## Priya Raman\n\nPriya leads the platform team.\n\n"
            "### Windows PowerShell\n\nOpen windows with a shell; French and Korean docs "
            "ship. Korean docs are new.\n")
    found = _weak_names(body, {"Token Behavior", "Audit Signatures", "Valid"})
    assert found.get("Token Behavior") is True and found.get("Audit Signatures") is True, found
    assert found.get("Valid") is True, found
    for name in ("Priya Raman", "Windows PowerShell", "French", "Korean"):
        assert found.get(name) is False, (name, found)
    # After a colon a word is capitalised by its place, not inside a sentence: a value its
    # document also writes in lower case is an ordinary word.
    body = "#### `name`\n\n* Type: String\n\nThe name is a string of at most 214 characters.\n"
    text, doc, mentions = _parsed(body)
    said = {e.name for s in read(doc, mentions, original=body, context=text) for e in s.entities}
    assert "String" not in said, said


def test_prose_sentences_read_as_a_reader_sees_them():
    """A summary's sentences (RAPTOR, stop 49): no heading, no list or quote marker, task
    box, emphasis or link target; code spans as written, so code still reads as code; a
    code block's lines stay as written (judged as code by their fences)."""
    from orchestrator.derive.quality import plausible_statement, prose_sentences

    text = ("#### Example - Client connect event\n\n"
            "This will allow **some** checks on the [socket](Socket.md#x).\n\n"
            "* **`upstream`** `string` - It should only include the **protocol**.\n"
            "- [x] Ship the *parser* today\n"
            "> Quoted wisdom here.\n\n"
            "```sh\n# not a heading\n- not an item\n```\n")
    pairs = prose_sentences(text)
    assert [shown for _, shown in pairs] == [
        "This will allow some checks on the socket.",
        "`upstream` `string` - It should only include the protocol.",
        "Ship the parser today",
        "Quoted wisdom here.",
        "```sh\n# not a heading\n- not an item\n```"]
    assert pairs[-1][0] == "```sh\n# not a heading\n- not an item\n```"
    # A code block is one unit, whatever blank lines or full stops it holds (undici's state
    # diagram: "pending --> idle : timeout" was a summary's sentence).
    diagram = ("The client has states.\n\n```mermaid\nstateDiagram-v2\n  idle --> pending\n\n"
               "  pending --> idle : timeout. Then\n```\n\nIt ends destroyed.")
    assert [w for w, _ in prose_sentences(diagram)] == [
        "The client has states.",
        "```mermaid\nstateDiagram-v2\n  idle --> pending\n\n  pending --> idle : timeout. Then\n```",
        "It ends destroyed."]
    assert not plausible_statement(prose_sentences(diagram)[1][0])


def test_a_headings_label_before_a_dash_names_only_a_known_entity():
    """undici's API reference (rules 22): "#### Example - Basic MockAgent instantiation" and
    "#### Example 2 - Dispatch Upgrade Request" made an organisation "Example" (19 claims)
    and "Example 2". A title-case word (or word and number) that opens a heading before a
    dash or colon labels what follows; a name there is still one where its document writes
    it inside a sentence too, other than in a link to a heading."""
    from orchestrator.derive import nlp
    from orchestrator.derive.quality import vocabulary_text

    body = ("### Example - Basic MockAgent instantiation\n\nThe agent is created once.\n\n"
            "#### Example 2 - Dispatch Upgrade Request\n\nThe request is upgraded.\n\n"
            "## Lena - onboarding notes\n\nOn Monday Lena books the venue.\n")
    text, doc, _ = _parsed(body)
    for word, weak in [("Example", True), ("Example 2", True), ("Lena", False)]:
        at = body.index(word)
        span = doc.char_span(at, at + len(word))
        assert nlp._list_opener(span, body, text) is weak, word
    # A link to a heading repeats its words as the heading capitalises them: no evidence of
    # a name (undici's Dispatcher.md: "As demonstrated in [Example 1 - Basic GET stream
    # request](#example-1---basic-get-stream-request)" kept "Example" an organisation).
    linked = body + ("\nAs demonstrated in [Example 2 - Dispatch Upgrade Request]"
                     "(#example-2---dispatch-upgrade-request), the request is upgraded.\n")
    text, doc, _ = _parsed(linked)
    at = linked.index("Example")
    span = doc.char_span(at, at + len("Example"))
    assert not nlp._list_opener(span, linked, text), "the link's words count as prose"
    assert nlp._list_opener(span, linked, vocabulary_text(linked, text))
    assert len(vocabulary_text(linked, text)) == len(text)


def test_a_list_items_label_or_short_value_names_only_a_known_entity():
    """npm's docs (rules 16): every setting is listed as "* Default: false", "* Type:
    Boolean", "* Type: null or String", and the small model read the type names as a group
    and a person: "Boolean" and "String" were entities of 113 and 90 claims. A list item's
    label and the words of its short value are weak (they name an entity only where one is
    known); a label's value that the document also writes in a sentence is a name, as is a
    longer value and a name in a sentence."""

    body = ("* Owner: Lena\n* Reviewer: Marcus Brody\n\nAll reviews went to Marcus Brody "
            "and then to Lena in Berlin.\n\n### Configuration\n\n#### `registry`\n\n"
            '* Default: "https://registry.npmjs.org/"\n* Type: URL\n\n'
            "The base URL of the npm registry.\n\n#### `otp`\n\n* Default: null\n"
            "* Type: null or String\n\nThis is a one-time password from a two-factor "
            "authenticator. It's needed\nwhen publishing or changing package permissions with "
            "`npm access`.\n\n#### `diff`\n\n* Default:\n* Type: String (can be set multiple "
            "times)\n\n#### `dry-run`\n\n* Default: false\n* Type: Boolean")
    found = _weak_names(body, {"Boolean", "String"})
    assert found.get("Boolean") is True and found.get("String") is True, found
    # A label alone (its value on the lines below) and a label's word are weak as well; a
    # name in a list item's sentence is not.
    from orchestrator.derive.nlp import _label_item, load_spacy

    for written, word, weak in [("* Default:\n* Type: Boolean\n", "Default", True),
                                ("- **Owner**: Lena\n", "Lena", True),
                                ("* Reviewers: Marcus and Lena asked for a second review of "
                                 "the draft before Friday\n", "Lena", False),
                                ("* Lena reviewed the draft.\n", "Lena", False)]:
        parsed = load_spacy()(mask_markup(written))
        at = written.index(word)
        span = parsed.char_span(at, at + len(word))
        assert _label_item(span, written, parsed.text) is weak, (written, word)
    # Lena is capitalised in a sentence of the document: a name wherever she stands.
    assert found.get("Lena") is False and found.get("Marcus Brody") is False, found


def test_a_list_of_links_is_no_statement():
    """A "See also" list is navigation: it was a RAPTOR summary's sentence ("* [npm
    access](/commands/npm-access) * [npm config](/commands/npm-config)"). A sentence with a
    link in it is prose."""
    from orchestrator.derive.quality import link_list, plausible_statement

    for said in ("* [npm access](/commands/npm-access)\n* [npm config](/commands/npm-config)\n"
                 "* [npm registry](/using-npm/registry)",
                 "See [npm install](/commands/npm-install) and [npm ci](/commands/npm-ci)."):
        assert link_list(said) and not plausible_statement(said), said
    for said in ("Run the tests before you push; see [the guide](docs/guide.md) for the rest.",
                 "Priya covers payments until the end of the quarter.",
                 "![badge](https://img.shields.io/x) The parser reads every Markdown file."):
        assert not link_list(said) and plausible_statement(said), said


def test_a_person_whose_name_no_person_has_is_a_product():
    """The small model types software, formats and units as people, and each got a person's
    profile (35 of 173 "people" of a folder of Node.js, Debian and Python docs)."""
    from orchestrator.derive.nlp import SpacyEntities, _person_or_product, load_spacy, read

    for name in ("AArch64", "C++ API", "JSON", "KB", "ASan", "JsonCpp", "Node.js", "MacOS",
                 "Zstandard CI", "encrypt2", "Tier 2", "Project Heron", "Operation Overlord"):
        assert _person_or_product(name, "person") == "product", name
    for name in ("Team Payments", "Committee on Budgets", "Acme Labs", "Initech Inc.",
                 "Wayne Technologies"):  # stop 35, 36
        assert _person_or_product(name, "person") == "organization", name
    for name in ("Grafana Cloud", "Figma Studio"):  # stop 36
        assert _person_or_product(name, "person") == "product", name
    for name in ("Ada Lovelace", "B. Jackowski", "Mary-Jane O'Neil", "Ronald McDonald",
                 "LeBron James", "J. R. R. Tolkien", "José Álvarez", "TJ Miller", "Louis XIV",
                 "Martin Luther King Jr.", 'Huckleberry "Huck" Finn', "al-Shuja\u2018i",
                 "Board", "Milestone Jones", "Cloud", "Labs", "Grace Server-Smith"):
        assert _person_or_product(name, "person") == "person", name
    assert _person_or_product("JSON", "organization") == "organization"  # people only
    # Places and groups named like software (stop 43: "Node.js" was a place).
    for name in ("Node.js", "Socket.IO", "ASP.NET", "D3.js", "C++ land"):
        assert _person_or_product(name, "place") == "product", name
        assert _person_or_product(name, "group") == "product", name
    for name in ("U.S.", "Washington D.C.", "St.Petersburg", "Bosnia & Herzegovina", "Oslo"):
        assert _person_or_product(name, "place") == "place", name
    body = ("Building an ASan build is easy, said Tavmjong Bah.\n\n"
            "Zstandard CI testing is split up into three sections.\n")
    nlp = load_spacy()
    doc = nlp(body)
    mentions = SpacyEntities("x").mentions([body], [doc])[0]
    typed = {body[m.start:m.end]: m.entity_type for m in mentions}
    assert typed == {"ASan": "person", "Tavmjong Bah": "person", "Zstandard CI": "person"}, typed
    found = {e.name: e.entity_type for s in read(doc, mentions, context=body) for e in s.entities}
    assert found == {"ASan": "product", "Tavmjong Bah": "person", "Zstandard CI": "product"}, found


def _extracted(folder: Path, settings, tenant_factory, app_engine) -> tuple[set[str], set[str]]:
    """``folder`` ingested into a fresh tenant and extracted: (entity names, fact texts)."""
    t = tenant_factory("code")
    writer = t.identity("writer", write=("code",))
    ingest_paths(settings, app_engine, writer, [folder], collection="readme", scopes=["code"])
    with bound_session(app_engine, writer) as s:
        extract(s, settings=settings)
    with bound_session(app_engine, writer) as s:
        names = set(s.execute(text("select canonical_name from knowledge.entities")).scalars())
        texts = set(s.execute(text("select text from knowledge.fact_content")).scalars())
    return names, texts


def test_an_entity_older_rules_typed_gets_the_current_rules_type_when_read_again(
        tenant_factory, app_engine, settings, tmp_path, monkeypatch):
    """A name's mentions go to the oldest entity of that name: "Node.js", a place before rules
    18, stayed a place in a tenant read before them. Read again, it is a product; an entity
    someone wrote about keeps its type."""
    import re

    from orchestrator.derive import nlp
    from orchestrator.ingest.knowledge import FactInput, assert_fact

    (tmp_path / "build.md").write_text(
        "# Build\n\nMaren Okafor moved the build to Node.js last week.\n\n"
        "Node.js runs the release tooling of Lindqvist Labs in Oslo.\n")
    tenants = [tenant_factory("code"), tenant_factory("code")]
    writers = [t.identity("writer", write=("code",)) for t in tenants]

    def types(writer) -> dict[str, str]:  # type: ignore[no-untyped-def]
        with bound_session(app_engine, writer) as s:
            return dict(s.execute(text("select canonical_name, entity_type "
                                       "from knowledge.entities")).all())

    # Read under the rules before 18 (no software shape for places), in both tenants; in the
    # second, someone writes about the place "Node.js" by hand.
    monkeypatch.setattr(nlp, "_SOFTWARE_SHAPE", re.compile(r"(?!)"))
    monkeypatch.setattr(nlp, "RULES_VERSION", "rules-17-test")
    for writer in writers:
        ingest_paths(settings, app_engine, writer, [tmp_path], collection="readme",
                     scopes=["code"])
        with bound_session(app_engine, writer) as s:
            extract(s, settings=settings)
        assert types(writer)["Node.js"] == "place", types(writer)
    with bound_session(app_engine, writers[1]) as s:
        node = s.execute(text("select id from knowledge.entities "
                              "where canonical_name = 'Node.js'")).scalar_one()
        assert_fact(s, FactInput(subject_id=node, predicate="hosts", value="the build",
                                 text="Node.js hosts the build.", scopes=("code",)))
    monkeypatch.undo()
    reports = []
    for writer in writers:
        with bound_session(app_engine, writer) as s:
            reports.append(extract(s, settings=settings))
    assert types(writers[0])["Node.js"] == "product", types(writers[0])
    assert types(writers[0])["Oslo"] == "place", types(writers[0])
    assert reports[0].retyped == 1 and "1 entity typed by older rules" in reports[0].line()
    assert types(writers[1])["Node.js"] == "place" and reports[1].retyped == 0


def test_a_person_its_document_unpersons_is_retyped_when_read_again(
        tenant_factory, app_engine, settings, tmp_path, monkeypatch):
    """Rules 20 type "Dispatcher" a product where its document also writes "dispatcher",
    which its name alone does not say (``typed_by_rules`` keeps a one-word noun): a tenant read
    under rules 19 kept it a person, with a profile, until a mention the current rules
    unperson (``Entity.unpersoned``) retypes it when read again."""
    from orchestrator.derive import nlp

    (tmp_path / "pool.md").write_text(
        "# Connections\n\nAsk Dispatcher for a connection. The dispatcher hands it out.\n")
    t = tenant_factory("code")
    writer = t.identity("writer", write=("code",))

    def dispatcher() -> str:
        with bound_session(app_engine, writer) as s:
            return str(s.execute(text("select entity_type from knowledge.entities "
                                      "where canonical_name = 'Dispatcher'")).scalar_one())

    monkeypatch.setattr(nlp, "_english_only", lambda name, context, nlp_: False)
    monkeypatch.setattr(nlp, "RULES_VERSION", "rules-19-test")
    ingest_paths(settings, app_engine, writer, [tmp_path], collection="notes", scopes=["code"])
    with bound_session(app_engine, writer) as s:
        extract(s, settings=settings)
    assert dispatcher() == "person"
    assert nlp.typed_by_rules("Dispatcher", "person") == "person"
    monkeypatch.undo()
    with bound_session(app_engine, writer) as s:
        report = extract(s, settings=settings)
    assert dispatcher() == "product" and report.retyped == 1, report


def test_extracted_claims_read_as_written(tenant_factory, app_engine, settings, tmp_path):
    (tmp_path / "ranker.md").write_text(
        "# Ranking\n\nMaren Okafor trains the model with `train_ranker.py` in Oslo.\n\n"
        "```sh\npython train_ranker.py --help  # Priya Raman wrote this\n```\n")
    names, texts = _extracted(tmp_path, settings, tenant_factory, app_engine)
    assert "Maren Okafor trains the model with `train_ranker.py` in Oslo." in texts, texts
    assert "Priya Raman" not in names and not any("--help" in x for x in texts), texts


def test_a_code_shaped_word_the_document_writes_as_code_is_no_name(
        tenant_factory, app_engine, settings, tmp_path):
    """Node's changelogs and API docs name classes bare in prose ("replace WeakSet global by
    the ..."), and the small model took each for an organisation; the same document writes
    "`WeakSet`" or "BooleanValue()" elsewhere (``quality.code_names``)."""
    from orchestrator.derive.quality import code_names

    assert code_names("use `WeakSet` and call BooleanValue() in `fs.readFile()`; Alice said "
                      "GitHub is nice.\n```js\nconst ee = new EventEmitter(); // Hi Alice\n```\n"
                      ) == {"WeakSet", "BooleanValue", "readFile", "EventEmitter"}
    (tmp_path / "changes.md").write_text(
        "# Changes\n\nMaren Okafor replaced WeakSet in the parser of Lindqvist Labs.\n\n"
        "Priya Raman moved EventEmitter into GitHub Actions for Lindqvist Labs.\n\n"
        "Use `new WeakSet()` and `EventEmitter` for this.\n")
    (tmp_path / "other.md").write_text(
        "# Other\n\nMaren Okafor replaced WeakSet in the parser of Lindqvist Labs.\n")
    names, _ = _extracted(tmp_path, settings, tenant_factory, app_engine)
    assert {"Maren Okafor", "Priya Raman", "Lindqvist Labs", "GitHub Actions"} <= names, names
    # Written as code in changes.md: no name there. other.md never writes WeakSet as code, and
    # names it (the rule reads one document at a time).
    assert "EventEmitter" not in names and "WeakSet" in names, names


CODE_ACROSS_CHUNKS = (
    "The release tool ships a small client library for the archive service.\n\n"
    "```python\n"
    "import archive\n"
    "client = archive.Client(host='archive.local', port=8080)\n"
    "client.login(user='svc', token=TOKEN)\n"
    "for path in sorted(paths):\n"
    "    client.upload(path, retries=3)\n"
    "# Maren Okafor founded Lindqvist Labs in Oslo.\n"
    "client.close()\n"
    "```\n"
    "Priya Raman works at Nordheat in Bergen.\n"
)


def test_a_code_block_cut_by_a_chunk_boundary_stays_code_and_the_prose_after_it_stays_prose(
        tenant_factory, app_engine, settings, tmp_path):
    from orchestrator.ingest.chunking import chunk_text

    small = settings.model_copy(update={"chunk_size_chars": 120, "chunk_overlap_chars": 0})
    spans = chunk_text(CODE_ACROSS_CHUNKS, 120, 0)
    # The setting this test is about: the comment in a chunk with no fence of its own (all of
    # it inside the block), the sentence in a chunk that starts inside the block.
    comment = next(s.text for s in spans if "Maren Okafor" in s.text)
    sentence = next(s.text for s in spans if "Priya Raman" in s.text)
    assert "```" not in comment and "```" in sentence and "```python" not in sentence, spans
    (tmp_path / "client.md").write_text(CODE_ACROSS_CHUNKS)
    names, _ = _extracted(tmp_path, small, tenant_factory, app_engine)
    # The comment in the code names no one; the sentence after the block does.
    assert not names & {"Maren Okafor", "Lindqvist Labs", "Oslo"}, names
    assert {"Priya Raman", "Nordheat"} <= names, names


def test_a_document_spanning_two_batches_is_read_and_masked_once():
    import uuid
    from types import SimpleNamespace

    from orchestrator.derive.extract import _Chunk, masked_texts

    doc, other = uuid.uuid4(), uuid.uuid4()
    body = "Prose.\n```\ncode()\n```\nMore prose."
    bodies = {doc: body, other: "Other prose."}
    reads: list[list[uuid.UUID]] = []

    class Session:  # answers the one query masked_texts makes, and counts it
        def execute(self, statement):  # type: ignore[no-untyped-def]
            ids = next(iter(statement.compile().params.values()))
            reads.append(ids)
            return [SimpleNamespace(id=i, body=bodies[i]) for i in ids]

    def chunk(d: uuid.UUID, start: int, end: int) -> _Chunk:
        return _Chunk(uuid.uuid4(), bodies[d][start:end], b"", (), "x", None, False, False, d, start)

    cache: dict[uuid.UUID, tuple[str, str, frozenset[str]]] = {}
    first = masked_texts(Session(), [chunk(doc, 0, 17)], cache)  # ends inside the block
    second = masked_texts(Session(), [chunk(doc, 18, len(body)), chunk(other, 0, 12)], cache)
    assert reads == [[doc], [other]]  # the document spanning both batches is read once
    assert first == ["Prose.\n   \n      "]  # the block's code, masked
    # The closing fence is the block's end, not a new block's start: the prose stays.
    assert second == ["   \nMore prose.", "Other prose."]
    masked_texts(Session(), [chunk(other, 0, 12)], cache)
    assert set(cache) == {other} and len(reads) == 2


def test_control_characters_are_masked_like_markup():
    """A pasted terminal log's escape sequences and a form feed are no prose: masked (same
    length) so a sentence read past them holds only what a reader sees."""
    body = "\x1b[31mAlice met Bob in Paris.\x1b[0m\x0c\nTabs\tand lines\r\nstay."
    masked = mask_markup(body)
    assert len(masked) == len(body)
    assert not any(c in masked for c in "\x1b\x0c")
    assert "Alice met Bob in Paris." in masked and "Tabs\tand lines\r\nstay." in masked


def test_a_chunk_without_words_is_not_parsed():
    """Masked punctuation, digits and table rows can yield no name and no three-word sentence:
    the parser gets blanks of the same length (offsets hold) instead of 1,200 tokens."""
    from orchestrator.derive.quality import blank_without_words

    for junk in ("](" * 600, "1." * 600, mask_markup("|1|2|3|\n" * 150), "!!! ??? ... 42"):
        assert blank_without_words(junk) == " " * len(junk)
    for prose in ("Alice met Bob.", "Ok", "東京", "<code>" * 3, "x1 y2 zz"):
        assert blank_without_words(prose) == prose


def test_a_word_joined_by_escaped_underscores_is_code_whole(
        tenant_factory, app_engine, settings, tmp_path):
    """Markdown writes an identifier outside a code span with its underscores escaped
    ("NGHTTP2\\_ERR\\_FLOW\\_CONTROL", 642 of them in Node's changelogs): with only the
    backslashes blanked the parser read "NGHTTP2 _ERR _FLOW _CONTROL" and took "NGHTTP2",
    "ERR" and "NULL" for organisations. The word is code, whole; a claim's sentence reads it
    as it renders."""
    from orchestrator.derive.quality import escaped_identifiers

    line = ("* \\[[`b8d145db2c`](https://github.com/nodejs/node/commit/b8d145db2c)] - **src**: "
            "fix order of CHECK\\_NOT\\_NULL/dereference (Tobias Nießen) [#59487](https://x.org/1)")
    masked = mask_markup(line)
    assert len(masked) == len(line) and "NULL" not in masked and "CHECK" not in masked
    assert " ".join(sentence_as_written(line, masked, 0, len(line)).split()) == (
        "`b8d145db2c` - src: fix order of CHECK_NOT_NULL/dereference (Tobias Nießen) #59487")
    # A code span's backslashes are its own; only the identifier reads as it renders.
    x = "run `a\\_b` then async\\_hooks now."
    assert " ".join(sentence_as_written(x, mask_markup(x), 0, len(x)).split()) == \
        "run `a\\_b` then async_hooks now."
    assert escaped_identifiers("in async\\_hooks, \\_\\_proto\\_\\_ and a lone \\_ mark") == [
        (3, 15), (17, 30)]
    # Linear: a long run of word characters around one escape is one scan.
    assert escaped_identifiers("a" * 200_000 + "\\_" + "b" * 200_000) == [(0, 400_002)]
    (tmp_path / "CHANGELOG.md").write_text(
        "# Changelog\n\n"
        "* handle NGHTTP2\\_ERR\\_FLOW\\_CONTROL error code (Rafael Gonzaga)\n"
        "* fix order of CHECK\\_NOT\\_NULL/dereference (Tobias Nießen)\n"
        "* rethrow stack overflow exceptions in async\\_hooks (Matteo Collina)\n")
    names, texts = _extracted(tmp_path, settings, tenant_factory, app_engine)
    assert {"Rafael Gonzaga", "Tobias Nießen"} <= names, names
    parts = {"NGHTTP2", "ERR", "FLOW", "CONTROL", "CHECK", "NOT", "NULL", "hooks"}
    assert not names & parts, names
    assert any("CHECK_NOT_NULL/dereference" in t for t in texts), texts
    assert not any("\\" in t for t in texts), texts


def test_a_wikilink_reads_as_the_page_it_names(tenant_factory, app_engine, settings, tmp_path):
    """Obsidian writes "[[Priya Raman|Priya]]", "[[Billing#Phase 2|the phase]]" and embeds
    "![[diagram.png]]": masked as brackets only, the parser read "Priya Raman|Priya" (no name:
    Priya Raman was never found) and a claim showed the bar and the anchor. A link reads as
    the page it names; its anchor and alias are masked, an embed whole."""
    x = ("Yesterday I met [[Priya Raman|Priya]] and [[Tomás Ortega]] in [[Oslo]] to plan the "
         "[[Billing migration#Phase 2|billing migration]]. See ![[diagram.png]] too.")
    masked = mask_markup(x)
    assert len(masked) == len(x) and "|" not in masked and "diagram" not in masked
    assert " ".join(sentence_as_written(x, masked, 0, len(x)).split()) == (
        "Yesterday I met Priya Raman and Tomás Ortega in Oslo to plan the Billing migration. "
        "See too.")
    # A title or heading as Obsidian shows it: the alias, else the page; no embed.
    from orchestrator.derive.quality import inline_text

    assert inline_text("Kickoff with [[Priya Raman|Priya]] in [[Oslo#Harbour]] ![[logo.png]]") \
        == "Kickoff with Priya in Oslo"
    # Linear on what never closes or nests.
    for bad in ("[[" * 100_000, "[[a|" * 100_000, "![[" + "a#" * 100_000 + "]]"):
        assert len(mask_markup(bad)) == len(bad)
    (tmp_path / "2026-03-02.md").write_text(
        "# Planning\n\nYesterday I met [[Priya Raman|Priya]] and [[Tomás Ortega]] in [[Oslo]] "
        "to plan the [[Billing migration#Phase 2|billing migration]].\n")
    names, texts = _extracted(tmp_path, settings, tenant_factory, app_engine)
    assert {"Priya Raman", "Tomás Ortega", "Oslo"} <= names, names
    assert not any("|" in n or "[" in n for n in names), names
    assert not any("|" in t or "[[" in t or "Phase 2" in t for t in texts), texts


# A paragraph of the project's Portuguese design note, as its source document writes it.
PORTUGUESE = (
    "Conflitos de fatos são contradições explícitas de valor, tempo ou relação. Detectadas nos "
    "ticks de consolidação e sob demanda, elas são resolvidas por estratégia. Três camadas de "
    "memória trabalham juntas para que o agente não esqueça o que já aprendeu com a equipe. "
    "Toda tabela com escopo de tenant é protegida por uma policy, e o runtime conecta como um "
    "role de app que não pode ignorar as políticas de Maria Souza.\n")


@pytest.mark.parametrize(("written", "language"), [
    (PORTUGUESE, "pt"),
    ("El equipo de datos revisa los informes de ventas cada semana y la directora los firma "
     "para que el consejo los lea con tiempo, pero no siempre es posible.", "es"),
    ("Die Mannschaft prüft die Berichte jede Woche, und der Leiter unterschreibt sie, damit "
     "der Vorstand sie mit Zeit lesen kann; das ist nicht immer möglich.", "de"),
    ("The team reviews the sales reports each week and the director signs them, so that "
     "the board can read them in time; this is not always possible.", "en"),
    # An English page quoting a phrase of another language stays English.
    ("The note's title is \"Conflitos de fatos\" and the team reads it as the conflicts of "
     "facts: each of them is a contradiction that the consolidation finds, and the design "
     "says that they are resolved by a strategy (\"são resolvidas por estratégia\").", "en"),
    # Names and capitalised words tell nothing; too few function words tell nothing.
    ("Die Hard, De Niro, La Scala, MIT, Le Monde, Der Spiegel", None),
    ("Options: timeout, retries, backoff", None),
])
def test_the_written_language_is_told_by_its_lower_case_function_words(written, language):
    from orchestrator.derive.quality import written_language

    assert written_language(written) == language


def test_a_chunk_is_foreign_by_its_own_words_else_by_its_documents():
    from orchestrator.derive.extract import foreign_language

    english = ("The team reviews the reports of the week, and the board reads them before "
               "the meeting, so that each of its members can say what is to be done.")
    assert foreign_language("en", PORTUGUESE, lambda: None) == "pt"
    assert foreign_language("en", english, lambda: "pt") is None  # its own words tell
    # A heading or a list of names tells nothing: the document's language decides.
    assert foreign_language("en", "Visão geral", lambda: "pt") == "pt"
    assert foreign_language("en", "Visão geral", lambda: None) is None
    assert foreign_language("en", "Visão geral", lambda: "en") is None
    # A Portuguese pipeline reads Portuguese and leaves English out.
    assert foreign_language("pt", PORTUGUESE, lambda: None) is None
    assert foreign_language("pt", english, lambda: None) == "en"
    # A pipeline of a language no function words tell (spaCy's multi-language "xx") reads all.
    assert foreign_language("xx", PORTUGUESE, lambda: "pt") is None


def test_a_page_in_another_language_than_the_entity_models_yields_no_entities(
        tenant_factory, app_engine, settings, tmp_path):
    """The project's own design note in Portuguese, read by the English entity model and
    sentence rules, made entities of "Conflitos de", "Detectadas" and "Três" (stop 50). A chunk
    in another language reads as nothing, the report counts it by language, and an English
    page beside it is read as before."""
    (tmp_path / "visao.md").write_text("# Visão geral\n\n" + PORTUGUESE)
    (tmp_path / "team.md").write_text(
        "# Team\n\nMaren Okafor leads the payments team at Lindqvist Labs in Oslo. "
        "She met Priya Raman in Berlin to plan the migration.\n")
    t = tenant_factory("code")
    writer = t.identity("writer", write=("code",))
    ingest_paths(settings, app_engine, writer, [tmp_path], collection="notes", scopes=["code"])
    with bound_session(app_engine, writer) as s:
        report = extract(s, settings=settings)
    with bound_session(app_engine, writer) as s:
        names = set(s.execute(text("select canonical_name from knowledge.entities")).scalars())
        texts = set(s.execute(text("select text from knowledge.fact_content")).scalars())
    assert {"Maren Okafor", "Priya Raman", "Oslo"} <= names, names
    assert not names & {"Conflitos de", "Detectadas", "Três", "Maria Souza"}, names
    assert not any("são" in x for x in texts), texts
    assert report.foreign == {"pt": 1}, report.foreign
    assert "1 chunks not in English (Portuguese 1) read for nothing" in report.line(), report.line()


def test_without_the_gates_a_page_in_another_language_is_read_as_before(
        tenant_factory, app_engine, settings, tmp_path):
    (tmp_path / "visao.md").write_text("# Visão geral\n\n" + PORTUGUESE)
    raw = settings.model_copy(update={"derive_quality_gates": False})
    t = tenant_factory("code")
    writer = t.identity("writer", write=("code",))
    ingest_paths(settings, app_engine, writer, [tmp_path], collection="notes", scopes=["code"])
    with bound_session(app_engine, writer) as s:
        report = extract(s, settings=raw)
    assert report.foreign == {} and report.entities, report.line()


def test_an_acronym_its_document_writes_as_a_common_noun_is_no_name():
    """This project's docs made organisations of API, CPU, GPU, CLI, DBA and UUID; undici's
    of DNS, JWT and MIME (stop 50). An acronym the document writes in the plural ("GPUs") or
    after "a"/"an" as the head of its phrase ("an API for ...") is a common noun. One after
    an article before another word may be a name used as a modifier ("a WHATWG
    spec-compliant implementation"), and an organisation's acronym stays one ("NVIDIA",
    "the IETF")."""
    from orchestrator.derive.nlp import read

    body = ("# Serving\n\n"
            "The API runs on NVIDIA GPUs in the Oslo office of Lindqvist Labs. Each GPU serves "
            "one model, and the IETF publishes the HTTP standard it speaks.\n\n"
            "Maren Okafor wrote an API for the scheduler. Priya Raman chose a WHATWG "
            "spec-compliant implementation of fetch; the API hands each request to the GPU "
            "that is free.\n")
    text, doc, mentions = _parsed(body)
    said = {text[m.start:m.end] for m in mentions}
    assert {"API", "GPU"} & said, said  # what NER says (else the test proves nothing)
    found = {e.name for s in read(doc, mentions, original=body, context=text) for e in s.entities}
    assert not found & {"API", "GPU"}, found
    assert {"Maren Okafor", "Priya Raman"} <= found, found
    assert found & said & {"NVIDIA", "IETF", "WHATWG"} == said & {"NVIDIA", "IETF", "WHATWG"}
    # In a document that never writes it as a common noun, the acronym stays what NER says.
    plain = body.replace("NVIDIA GPUs", "NVIDIA hardware").replace("an API for", "the scheduler for")
    text, doc, mentions = _parsed(plain)
    kept = {e.name for s in read(doc, mentions, original=plain, context=text) for e in s.entities}
    assert "API" in {text[m.start:m.end] for m in mentions} and "API" in kept, kept
