"""Extraction: entities, relations and dates from chunk text, as low-confidence claims.

Each chunk is parsed by the packaged spaCy pipeline; its entity mentions come
from GLiNER when one is configured and present, else from spaCy's NER
(``orchestrator.derive.nlp.choose_backend``; which one, and why, is logged at
the start of every run and printed in its report). Mentions are linked to
existing entities through ``knowledge.resolve_entity_within`` (names and aliases,
normalised, among the entities shared into every scope of the chunk, so every
reader of the chunk can read the entity) and created in the chunk's scopes when
none matches. What the text
says becomes claims, confidence 0.3 and ``author_role = 'extractor'`` (a pattern
matcher is not a witness), written through ``knowledge.assert_facts``, so the
shape checks and quarantine apply:

* ``mentioned_in``: the entity is named in ``collection/path`` (once per chunk; said with
  the chunk's first sentence that says something about it: a heading or a list of names
  only where nothing does);
* ``mentioned_on`` / ``mentioned_in_month`` / ``mentioned_in_year``: a date of that
  precision named in the same sentence, typed (``date``, ``YYYY-MM``, integer);
* ``co_mentioned_with``: two entities named in one sentence (the community graph), in a
  sentence that names at most ``CO_MENTION_LIMIT`` (a longer run of names is a list);
* subject-verb-object relations (``works_at``, ``founds``, ``is``...), to an entity
  or a short literal.

**Which chunks.** Those the caller may write (everything derived from a chunk is
shared into exactly its scope set) whose current version was not read yet:
``memory.extractions`` records per chunk the content hash, scope set and
reader (backend and rules version) of the last run and the claims it wrote. A
chunk is read again when its scopes or the reader changed; then the claims that
still hold are kept as they are, the ones the text no longer yields are
retracted (``knowledge.retract_claims``), and only new ones are written, so a
rerun never duplicates a claim. A chunk that is deleted (its document edited or
deleted) retracts its claims in the same transaction (trigger of migration
``0018_extraction``). A document whose metadata says ``"extract": false``
(front matter ``extract: false``) is never read, and what was read from it
before is retracted: its owner brings their own claims.

**Concurrency.** A run takes the ``extract`` job lock of its tenant first, so a
worker tick, the worker's on-ingest pass and ``engram derive extract`` queue
behind each other and the later one finds the earlier one's records; chunks
being read are locked ``FOR KEY SHARE``, so an edit of their document waits for
the read and then retracts its claims (a chunk deleted while the run waited for
it is not read). The embedding worker's ``FOR NO KEY UPDATE`` does not conflict.

**Speed.** Chunks go through ``nlp.pipe`` in batches of ``extract_batch_chunks``,
the next batch parsed in a thread while this one is written; each batch resolves
its new entities in one statement per scope set, interns and inserts all its
claims in two statements, records lineage and extraction records in one each.
One run is one transaction and one ``derive.extract`` provenance activity; every
claim is recorded as derived from its chunk.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import TEXT, Engine, and_, case, cast, func, literal, not_, or_, select, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID, insert
from sqlalchemy.orm import Session

from orchestrator.audit.lineage import begin_activity, end_activity, record_derivations
from orchestrator.config import Settings, get_settings
from orchestrator.db.derive_models import Extraction
from orchestrator.db.models import Chunk, Document, Scope
from orchestrator.derive import poison
from orchestrator.derive.nlp import (
    RULES_VERSION,
    SPACY_MODEL,
    TYPE_PRECEDENCE,
    BackendChoice,
    Entity,
    Sentence,
    choose_backend,
    load_spacy,
    name_word_key,
    read,
    short_name,
    short_name_targets,
    title_entity,
    typed_by_rules,
)
from orchestrator.derive.quality import (
    LANGUAGE_NAMES,
    blank_without_words,
    code_names,
    mask_markup,
    vocabulary_text,
    written_language,
)
from orchestrator.derive.service import ServiceTenant, job_lock, service_session, service_tenants
from orchestrator.errors import BadInput, EngramError, Unavailable, is_unavailable
from orchestrator.health import Component, supervise
from orchestrator.ingest.aliases import GivenAliases, give_document_aliases
from orchestrator.ingest.knowledge import (
    FactInput,
    assert_facts,
    literal_value,
    retract_claims,
    savepoint,
)

log = logging.getLogger("engram.derive.extract")

__all__ = ["EXTRACTED_CONFIDENCE", "SPACY_MODEL", "ExtractOnIngest", "ExtractReport", "extract"]

# knowledge.entities' ck_entities_canonical_name_length: a longer mention is no name.
MAX_ENTITY_NAME_CHARS = 500
# A pattern matcher's claims must never outrank what a person asserted.
EXTRACTED_CONFIDENCE = 0.3
AUTHOR_ROLE = "extractor"
# Claims about where and with whom an entity is named: bookkeeping for the graph and
# for lineage, not statements about the world (consolidation treats them so).
BOOKKEEPING_PREDICATES = ("mentioned_in", "co_mentioned_with")
# A "sentence" naming more entities than this is a list or a table, not a statement about
# them together: its entities are mentioned, not paired (rules 24). A glyph coverage table
# in /usr/share/doc (fonts-dejavu-core's status.txt: "2.4 (Sans, Sans Bold, Sans Bold
# Oblique, Sans Condensed, ...)" over 1,163 chunks) made 146,884 of the 202,487 claims
# extraction wrote for 17,489 chunks, nearly all of them pairs; prose and conversation name
# a few at a time.
CO_MENTION_LIMIT = 10

Progress = Callable[[int, int], None]


@dataclass
class ExtractReport:
    chunks: int = 0
    entities: set[uuid.UUID] = field(default_factory=set)
    claims: list[uuid.UUID] = field(default_factory=list)  # written by this run
    quarantined: list[uuid.UUID] = field(default_factory=list)
    kept: int = 0  # claims of re-read chunks that still hold, left as they were
    relations: int = 0  # subject-verb-object claims among ``claims``
    dates: int = 0  # dated mentions among ``claims``
    retracted: int = 0  # claims the text no longer yields (re-read or opted-out chunks)
    skipped_mentions: int = 0  # entity mentions too long to be a name, left out
    skipped_chunks: int = 0  # chunks whose writes the database refused, left out (poison.item)
    skipped: list[poison.Skipped] = field(default_factory=list)  # what was left out, and why
    opted_out: int = 0  # chunks of documents with extract: false whose earlier reading was withdrawn
    aliases_removed: int = 0  # aliases a note's front matter gave and no document gives any longer
    # entities of a name another entity of that name now stands for (rules 15), merged into it
    merged: int = 0
    merges_refused: int = 0  # such merges the database refused (logged; left apart)
    retyped: int = 0  # entities an older rule typed, given the type the current rules give
    # list items' and headings' first words, heading labels and adjectives by their place
    # (``Entity.weak``) that name no known entity
    openers_skipped: int = 0
    # chunks written in another language than the pipeline's (``language``), by language:
    # read as holding nothing (``quality.written_language``)
    foreign: dict[str, int] = field(default_factory=dict)
    language: str = "en"  # the pipeline's
    backend: str = ""
    notice: str | None = None
    more: bool = False  # stopped at the limit: more chunks are waiting
    seconds: float = 0.0
    waited: float = 0.0  # of ``seconds``, queued behind another run of this tenant (job_lock)

    def add(self, other: ExtractReport) -> None:
        self.chunks += other.chunks
        self.entities |= other.entities
        self.claims += other.claims
        self.quarantined += other.quarantined
        self.skipped += other.skipped
        for name in ("kept", "relations", "dates", "retracted", "opted_out", "skipped_mentions",
                     "skipped_chunks", "seconds", "waited", "aliases_removed", "openers_skipped",
                     "merged", "merges_refused", "retyped"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for language, n in other.foreign.items():
            self.foreign[language] = self.foreign.get(language, 0) + n
        self.language = other.language
        self.backend = other.backend or self.backend
        self.notice = other.notice or self.notice
        self.more = other.more

    def line(self) -> str:
        working = self.seconds - self.waited
        rate = f", {self.chunks / working:.1f} chunks/s" if working > 0 and self.chunks else ""
        if self.waited >= 0.1:  # another run of this tenant (a server's, on ingest) held the job
            rate += f"; {self.waited:.1f}s of it waiting for another extraction of this tenant"
        gone = f", {self.retracted} retracted" if self.retracted else ""
        out = f", {self.opted_out} opted-out chunks withdrawn" if self.opted_out else ""
        if self.aliases_removed:
            out += f", {self.aliases_removed} aliases no note gives any longer removed"
        if self.merged:
            out += (f", {self.merged} entities of a name another of that name stands for merged "
                    "into it")
        if self.merges_refused:
            out += f", {self.merges_refused} such merges refused (logged; left apart)"
        if self.retyped:
            out += (f", {self.retyped} entit{'y' if self.retyped == 1 else 'ies'} typed by "
                    "older rules given the current rules' type")
        if self.openers_skipped:
            out += (f", {self.openers_skipped} words capitalised by their place (list items', "
                    "headings' and sentences' openers, heading labels) naming no known entity "
                    "left out")
        if self.foreign:
            names = ", ".join(f"{LANGUAGE_NAMES.get(k, k)} {n}"
                              for k, n in sorted(self.foreign.items(), key=lambda kv: -kv[1]))
            reads = LANGUAGE_NAMES.get(self.language, self.language)
            out += (f", {sum(self.foreign.values())} chunks not in {reads} ({names}) read for "
                    f"nothing (the entity model and the sentence rules read {reads})")
        left = "".join([f", {self.skipped_mentions} entity mentions too long to be a name skipped"
                        if self.skipped_mentions else "",
                        f", {self.skipped_chunks} chunks skipped" if self.skipped_chunks else ""])
        return (f"{self.chunks} chunks read: {len(self.entities)} entities, "
                f"{len(self.claims)} claims ({self.relations} relations, {self.dates} dates), "
                f"{len(self.quarantined)} quarantined{gone}{out}{left}; entities by {self.backend} "
                f"({self.seconds:.1f}s{rate})")


def foreign_language(pipeline: str, text: str, document: Callable[[], str | None]) -> str | None:
    """The language a chunk's ``text`` is written in where it is not ``pipeline``'s (the
    entity model and the sentence rules read that one), else None. Told by the chunk's own
    words, else by its ``document``'s (a chunk of headings and code tells nothing). A
    pipeline of a language ``quality.written_language`` cannot tell (spaCy's multi-language
    "xx") reads every chunk."""
    if pipeline not in LANGUAGE_NAMES:
        return None
    told = written_language(text)
    if told is None:
        told = document()
    return told if told is not None and told != pipeline else None


class Foreign(str):
    """What reading a chunk gave where it is written in another language than the pipeline's:
    that language (a key of ``quality.LANGUAGE_NAMES``)."""


@dataclass(frozen=True)
class _Chunk:
    id: uuid.UUID
    text: str
    content_hash: bytes  # of what reading it reads (``_read``): what its record keeps
    scopes: tuple[uuid.UUID, ...]
    where: str
    anchor: date | None
    opted_out: bool
    read_before: bool
    document_id: uuid.UUID | None = None
    start: int = 0  # where the chunk's text starts in its document's body
    title: str = ""  # the document's
    aliases: tuple[str, ...] = ()  # the document's front matter ``aliases`` (Obsidian's)
    subject: Entity | None = None  # the title read as one entity (set after parsing)
    title_failed: bool = False  # reading the title failed (skipped and shown): its aliases stay


# Front matter aliases taken per document: Obsidian's ``aliases`` (or ``alias``), a list or
# one name; each within the length of an entity name.
MAX_DOCUMENT_ALIASES = 20


def document_aliases(value: Any) -> tuple[str, ...]:
    """The names a document's front matter gives its subject besides its title."""
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    out = [" ".join(str(v).split()) for v in items if isinstance(v, str | int | float)
           and not isinstance(v, bool)]
    return tuple(dict.fromkeys(a for a in out if 0 < len(a) <= 200))[:MAX_DOCUMENT_ALIASES]


def _opted_out() -> Any:
    flag = func.coalesce(Document.metadata_["extract"], cast(literal("true"), JSONB))
    return flag == cast(literal("false"), JSONB)


def _read() -> tuple[Any, Any]:
    """(the front matter aliases of a chunk's document, the hash of what reading the chunk
    reads): its text's hash, or where its document has aliases (not none, not an empty
    list), that hash with the title and the aliases, so a note whose front matter changed
    is read again though its text did not (the title's entity and its aliases come from
    them)."""
    aliases = func.coalesce(Document.metadata_["aliases"], Document.metadata_["alias"])
    given = func.nullif(func.nullif(aliases, cast(literal("null"), JSONB)),
                        cast(literal("[]"), JSONB))  # ``aliases: []`` (a template's) is none
    front = func.convert_to(func.coalesce(Document.title, "") + "\n" + cast(aliases, TEXT), "UTF8")
    read = case((given.is_(None), Chunk.content_hash),
                else_=func.sha256(Chunk.content_hash.op("||")(front)))
    return aliases, read


def _pending(model: str, document_ids: Sequence[uuid.UUID] | None) -> Any:
    """Chunks to read (new, changed text, front matter, scopes or reader) or to withdraw
    (document opted out)."""
    writable = Chunk.scopes.contained_by(func.auth.write_scopes(type_=ARRAY(UUID(as_uuid=True))))
    same_scopes = and_(Extraction.scopes.contains(Chunk.scopes), Extraction.scopes.contained_by(Chunk.scopes))
    aliases, read = _read()
    stale = or_(Extraction.chunk_id.is_(None), Extraction.content_hash != read,
                Extraction.model != model, not_(same_scopes))
    out = _opted_out()
    query = (
        select(Chunk.id, Chunk.text, read.label("content_hash"), Chunk.scopes, Document.collection,
               Document.path, Document.occurred_at, out.label("opted_out"),
               Extraction.chunk_id.is_not(None).label("read_before"), Chunk.document_id,
               Chunk.char_start, Document.title, aliases.label("aliases"))
        .join(Document, (Document.tenant_id == Chunk.tenant_id) & (Document.id == Chunk.document_id))
        .outerjoin(Extraction, (Extraction.tenant_id == Chunk.tenant_id) & (Extraction.chunk_id == Chunk.id))
        .where(writable, or_(and_(not_(out), stale), and_(out, Extraction.chunk_id.is_not(None))))
    )
    if document_ids is not None:
        query = query.where(Chunk.document_id.in_(list(document_ids)))
    return query


def pending_chunks(session: Session, *, document_ids: Sequence[uuid.UUID] | None = None,
                   settings: Settings | None = None) -> int:
    """How many chunks a run would read or withdraw now (for progress bars)."""
    return waiting_chunks(session, document_ids, settings)[0]


def waiting_chunks(session: Session, document_ids: Sequence[uuid.UUID] | None,
                   settings: Settings | None = None) -> tuple[int, int, int]:
    """(how many chunks a run would read or withdraw now, of ``document_ids`` where given; how
    many of them wait for their embedding first; of how many documents): what ``engram
    ingest`` hands to the worker. A document whose title changed but not its text has nothing
    to read again, unless its front matter gives aliases (``_read``)."""
    model = choose_backend(settings or get_settings()).model_key
    inner = _pending(model, document_ids).subquery()
    waiting, unembedded, documents = session.execute(
        select(func.count(), func.count().filter(Chunk.embed_state == "pending"),
               func.count(func.distinct(Chunk.document_id)))
        .select_from(inner.join(Chunk, Chunk.id == inner.c.id))).one()
    return int(waiting), int(unembedded), int(documents)


_backend_lock = threading.Lock()
_announced: set[str] = set()


def backend_for(settings: Settings) -> BackendChoice:
    """The entity backend, said once per process in the log (the report says it every run)."""
    with _backend_lock:
        choice = choose_backend(settings)
        if choice.model_key not in _announced:
            _announced.add(choice.model_key)
            if choice.notice:
                log.warning("extract: %s", choice.notice)
            else:
                log.info("extract: entities by %s", choice.description)
    return choice


def extract(session: Session, *, document_ids: Sequence[uuid.UUID] | None = None, limit: int = 1000,
            settings: Settings | None = None, on_progress: Progress | None = None) -> ExtractReport:
    """Read (or withdraw) up to ``limit`` chunks not yet read in their current version."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise BadInput(f"limit must be a positive integer, not {limit!r}")
    settings = settings or get_settings()
    if settings.extract_batch_chunks < 1:
        raise BadInput(f"ENGRAM_EXTRACT_BATCH_CHUNKS must be at least 1, not {settings.extract_batch_chunks}")
    started = time.monotonic()
    choice = backend_for(settings)
    report = ExtractReport(backend=choice.description, notice=choice.notice)
    queued = time.monotonic()
    job_lock(session, "extract")
    report.waited = time.monotonic() - queued
    found = session.execute(_pending(choice.model_key, document_ids).order_by(Chunk.id).limit(limit + 1)
                            .with_for_update(key_share=True, of=Chunk)).all()
    report.more = len(found) > limit
    chunks = [_Chunk(r.id, r.text, bytes(r.content_hash), tuple(r.scopes), f"{r.collection}/{r.path}"[:2000],
                     r.occurred_at.date() if r.occurred_at else None, bool(r.opted_out), bool(r.read_before),
                     r.document_id, r.char_start, r.title, document_aliases(r.aliases))
              for r in found[:limit]]
    if not chunks:
        report.seconds = time.monotonic() - started
        return report
    again = sum(c.read_before for c in chunks)
    log.info("extract: %d chunks%s, entities by %s", len(chunks),
             f" ({again} read before, read again: their text, front matter aliases, scopes, the "
             f"rules ({RULES_VERSION}) or the model changed)" if again else "", choice.description)
    begin_activity(session, "derive.extract", {"model": choice.model_key, "chunks": len(chunks)})
    writer = _Writer(session, choice.model_key, report, gates=settings.derive_quality_gates)
    withdrawn = [c for c in chunks if c.opted_out]
    if withdrawn:
        writer.withdraw(withdrawn)
    done = len(withdrawn)
    todo = [c for c in chunks if not c.opted_out]
    nlp = load_spacy(settings.extract_spacy_model)
    size = settings.extract_batch_chunks

    gates = settings.derive_quality_gates

    languages: dict[uuid.UUID, str | None] = {}  # document id -> its language (parsing thread)
    report.language = nlp.lang

    def language(chunk: _Chunk, text: str, context: str | None) -> str | None:
        """``foreign_language`` of ``chunk`` where the quality gates are on; its document's
        language is told once."""
        def document() -> str | None:
            if context is None or chunk.document_id is None:
                return None
            if chunk.document_id not in languages:
                languages[chunk.document_id] = written_language(context)
            return languages[chunk.document_id]

        return foreign_language(nlp.lang, text, document) if gates else None

    def parse(batch: list[_Chunk], texts: list[str], contexts: list[str | None],
              codes: list[frozenset[str]]
              ) -> tuple[list[list[Sentence] | str], dict[uuid.UUID, Entity | str]]:
        """Each chunk's sentences, or why reading it failed: one chunk whose text a rule
        cannot read must not stop the batch (the caller skips, counts and shows it); and the
        title of each document with front matter aliases, read as one entity where it is one
        (``_Writer._document_aliases``), or why reading it failed. A chunk written in another
        language than the pipeline's reads as no sentence (``language``): ``Foreign``."""
        # Foreign(language), None (read it), or why telling its language failed: one chunk
        # no rule can read must not stop the batch (as ``read`` below).
        foreign: list[Foreign | str | None] = []
        for c, t, x in zip(batch, texts, contexts, strict=True):
            try:
                told = language(c, t, x)
                foreign.append(Foreign(told) if told else None)
            except Exception as exc:
                foreign.append(poison.reason_of(exc))
        texts = [" " * len(t) if f is not None else t for t, f in zip(texts, foreign, strict=True)]
        docs = list(nlp.pipe(texts, batch_size=size))
        mentions = choice.backend.mentions(texts, docs)
        subjects: dict[uuid.UUID, Entity | str] = {}
        for c in batch:
            if c.aliases and c.document_id is not None and c.document_id not in subjects:
                try:
                    found = title_entity(nlp, choice.backend, c.title, gates=gates)
                except Exception as exc:  # a title no rule can read names no subject
                    subjects[c.document_id] = poison.reason_of(exc)
                    continue
                if found is not None:
                    subjects[c.document_id] = found
        out: list[list[Sentence] | str] = []
        for c, d, m, x, k, f in zip(batch, docs, mentions, contexts, codes, foreign,
                                    strict=True):
            if f is not None:  # in another language, or its language could not be told
                out.append(f)
                continue
            try:
                # Parsed masked, read back as written: a claim's sentence keeps its inline code.
                out.append(read(d, m, c.anchor, gates=gates, original=c.text, context=x, nlp=nlp,
                                code=k))
            except Exception as exc:  # any rule's failure: the chunk's skip reason
                out.append(poison.reason_of(exc))
        return out, subjects

    # The next batch is parsed while this one is written: the writes wait on the
    # database's own process, so parsing and writing use both cores. spaCy objects
    # never leave the parsing thread (they are not thread-safe); only Sentences do.
    batches = [todo[i:i + size] for i in range(0, len(todo), size)]
    # Code, URLs, markup and log lines become spaces of the same length (offsets hold), masked
    # over the whole document and cut out per chunk: a chunk that starts inside a fenced code
    # block does not know it is code (its first fence would open a block over the prose).
    documents: dict[uuid.UUID, tuple[str, str, frozenset[str], str]] = {}

    def texts_of(batch: list[_Chunk]
                 ) -> tuple[list[_Chunk], list[str], list[str | None], list[frozenset[str]]]:
        """The batch, its texts to parse, each chunk's whole document masked (None: the chunk
        alone) and the code-shaped words that document writes as code (``code_names``), read
        here: the parsing thread never touches the cache."""
        if not gates:
            return batch, [c.text for c in batch], [None] * len(batch), [frozenset()] * len(batch)
        texts = [blank_without_words(t) for t in masked_texts(session, batch, documents)]
        # The words of links to headings are no evidence of a name (``vocabulary_text``).
        return batch, texts, [documents[c.document_id][3]
                              if c.document_id in documents else None
                              for c in batch], [documents[c.document_id][2]
                                                if c.document_id in documents
                                                else code_names(c.text) for c in batch]

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="engram-extract-parse") as pool:
        parsed = pool.submit(parse, *texts_of(batches[0])) if batches else None
        for k, batch in enumerate(batches):
            assert parsed is not None
            readable: list[_Chunk] = []
            sentences: list[list[Sentence]] = []
            results, subjects = parsed.result()
            failed = {d for d, why in subjects.items() if isinstance(why, str)}
            for document_id in failed:
                where = next(c.where for c in batch if c.document_id == document_id)
                poison.skip(f"the title of {where}", f"reading it as a name failed "
                            f"({subjects[document_id]}); its front matter aliases name an entity "
                            "of that name only (none: what the note gave before stays)")
            batch = [replace(c, subject=_subject(subjects, c),
                             title_failed=c.document_id in failed)
                     if c.aliases else c for c in batch]
            for c, read_ in zip(batch, results, strict=True):
                if isinstance(read_, Foreign):
                    report.foreign[str(read_)] = report.foreign.get(str(read_), 0) + 1
                    readable.append(c)  # read: nothing taken (an earlier reading's claims go)
                    sentences.append([])
                elif isinstance(read_, str):
                    poison.skip(f"chunk {c.id} of {c.where}", f"reading its text failed ({read_}); "
                                "the other chunks are read, this one recorded as read with "
                                "nothing taken (a new version of it is read afresh)")
                    writer.nothing_taken(c)
                else:
                    readable.append(c)
                    sentences.append(_fit_names(c, read_, report))
            parsed = (pool.submit(parse, *texts_of(batches[k + 1]))
                      if k + 1 < len(batches) else None)
            if poison.careful():
                writer.write_each(readable, sentences)
            else:
                writer.write(readable, sentences)
            done += len(batch)
            if on_progress is not None:
                on_progress(done, len(chunks))
    end_activity(session)
    report.seconds = time.monotonic() - started
    return report


def _subject(subjects: dict[uuid.UUID, Entity | str], chunk: _Chunk) -> Entity | None:
    """The entity ``chunk``'s document title reads as, where parsing found one."""
    found = subjects.get(chunk.document_id) if chunk.document_id is not None else None
    return found if isinstance(found, Entity) else None


def masked_texts(session: Session, batch: Sequence[_Chunk],
                 cache: dict[uuid.UUID, tuple[str, str, frozenset[str], str]] | None = None
                 ) -> list[str]:
    """Each chunk's text with its document's code and markup masked (``mask_markup`` over the
    whole body, then the chunk's span of it). A chunk whose document is not readable or whose
    span no longer matches the body is masked on its own, as before. ``cache`` (document id ->
    body, masked body, the code-shaped words it writes as code: ``quality.code_names``, and
    the masked body its vocabulary is read from: ``quality.vocabulary_text``)
    carries a document whose chunks run on into the next batch (chunks come in id order, so one
    document's are consecutive): it is read and masked once, and the cache keeps only this
    batch's documents."""
    cache = {} if cache is None else cache
    ids = {c.document_id for c in batch if c.document_id is not None}
    missing = [i for i in ids if i not in cache]
    if missing:
        for r in session.execute(select(Document.id, Document.body).where(Document.id.in_(missing))):
            masked = mask_markup(r.body)
            cache[r.id] = (r.body, masked, code_names(r.body), vocabulary_text(r.body, masked))
    out = []
    for c in batch:
        body, masked, _, _ = (cache.get(c.document_id, (None, "", frozenset(), ""))
                              if c.document_id is not None else (None, "", frozenset(), ""))
        end = c.start + len(c.text)
        out.append(masked[c.start:end] if body is not None and body[c.start:end] == c.text
                   else mask_markup(c.text))
    for stale in set(cache) - ids:
        del cache[stale]
    return out


def _fit_names(chunk: _Chunk, sentences: list[Sentence], report: ExtractReport) -> list[Sentence]:
    """The chunk's sentences without entity mentions too long to be a name (a table row or a
    code line that NER took for one): the database would refuse such an entity, and with it
    the whole run. Each chunk's are skipped, counted and shown; its other entities stay."""
    too_long = {e for s in sentences for e in s.entities if len(e.name.strip()) > MAX_ENTITY_NAME_CHARS}
    if not too_long:
        return sentences
    report.skipped_mentions += len(too_long)
    poison.skip(f"{len(too_long)} entity mention(s) in chunk {chunk.id} of {chunk.where}",
                f"longer than the {MAX_ENTITY_NAME_CHARS} characters an entity name may have (the "
                f"longest has {max(len(e.name.strip()) for e in too_long)}); the chunk's other "
                "entities and claims are kept")
    return [replace(s, entities=[e for e in s.entities if e not in too_long],
                    relations=[r for r in s.relations
                               if r.subject not in too_long and r.object not in too_long])
            for s in sentences]


def _old_key(subject: uuid.UUID, predicate: str, object_id: uuid.UUID | None, value: str | None,
             datatype: str, text_: str, scopes: Sequence[uuid.UUID]) -> tuple[Any, ...]:
    return (subject, predicate, object_id, value, datatype, text_, tuple(sorted(scopes, key=str)))


def _extractor_only(entity: str) -> str:
    """SQL: whether the ``knowledge.entities`` row ``entity`` (an alias in the query) is only
    the extractor's: no note gives it an alias, something is said about it, and everything
    said about it is the extractor's. Such an entity may be merged into another of its name
    (``_Writer._merge_same_names``, rules 15); one someone made or wrote about is left as
    it is, and is known apart from weak mentions (``_KNOWN_APART``)."""
    about = (f"from knowledge.fact_claim c where c.tenant_id = {entity}.tenant_id "
             f"and (c.subject_id = {entity}.id or c.object_id = {entity}.id)")
    return (f"({entity}.given_aliases = '{{}}'::jsonb "
            f"and exists (select 1 {about} and c.author_role = 'extractor') "
            f"and not exists (select 1 {about} and c.author_role is distinct from 'extractor'))")


# Whether the entity ``r.id`` is known apart from the weak mentions that would name it
# (``Entity.weak``: a list item's first word, a label's value): it is not only the
# extractor's (``_extractor_only``: someone made it, wrote about it or gave it an alias in a
# note), or a chunk read under the current model and rules (``:m``) names it. An entity only
# extraction under older rules made is none: "* Type: Boolean" made "Boolean" under rules
# 15, and a weak mention resolving to it would keep it for good; read again, its chunks let
# it go (rules 16).
_KNOWN_APART = (
    "(not exists (select 1 from knowledge.entities g where g.tenant_id = auth.tenant_id() "
    f"and g.id = r.id and {_extractor_only('g')}) "
    "or exists (select 1 from memory.extractions x where x.tenant_id = auth.tenant_id() "
    "and x.model = :m and r.id = any(x.entity_ids)))")


# The types the rules (``nlp.typed_by_rules``) may change: a "person", "place" or "group"
# named like software, an undertaking or a company.
RETYPED = ("person", "place", "group")


class _Writer:
    """The writes of one run: entities resolved once per run, claims and records per batch."""

    def __init__(self, session: Session, model: str, report: ExtractReport,
                 gates: bool = True) -> None:
        self.session = session
        self.model = model
        self.report = report
        self.gates = gates  # the type rules apply (``derive_quality_gates``)
        self.entity_ids: dict[tuple[tuple[uuid.UUID, ...], str, str], uuid.UUID] = {}
        self.titled: dict[uuid.UUID, uuid.UUID] = {}  # chunk -> the entity its title names
        self.scope_names: dict[uuid.UUID, str] = {
            r[0]: r[1] for r in session.execute(select(Scope.id, Scope.name))}

    def _resolve(self, batch: Sequence[_Chunk], read_: Sequence[list[Sentence]]
                 ) -> list[list[Sentence]]:
        """Every entity the batch names, resolved or made (``entity_ids``); returns the
        sentences without the mentions that name nothing: a list item's or heading's first
        word (``Entity.weak``) names an entity only where one is known already."""
        # The documents' aliases first: an alias a note's front matter gives names its person
        # below ("Tomás" typed a place), and one it no longer gives goes before a first name
        # the text still uses becomes the person's own alias again (the end).
        self.report.aliases_removed += give_document_aliases(
            self.session, self._document_aliases(batch))
        stands_for = self._short_names(batch, read_)
        # entity -> whether every mention of it is weak (one ordinary mention makes it)
        wanted: dict[tuple[uuid.UUID, ...], dict[Entity, bool]] = defaultdict(dict)
        mentions: Counter[tuple[tuple[uuid.UUID, ...], Entity]] = Counter()
        # Names a mention of which the rules made a product of a person by what its document
        # writes (``Entity.unpersoned``), per scope set.
        unpersoned: set[tuple[tuple[uuid.UUID, ...], str]] = set()
        for chunk, sentences in zip(batch, read_, strict=True):
            for s in sentences:
                for e in s.entities:
                    full = stands_for.get((chunk.scopes, e))
                    if full is not None:
                        e = Entity("person", full)  # resolved as the person it stands for
                    if (chunk.scopes, e.entity_type, e.name) not in self.entity_ids:
                        known = wanted[chunk.scopes]
                        known[e] = known.get(e, True) and e.weak
                        mentions[(chunk.scopes, e)] += 1
                        if e.unpersoned:
                            unpersoned.add((chunk.scopes, e.name))
        # Each name's key as resolution matches it (``knowledge.normalize_name``), one query.
        names = sorted({e.name for entities in wanted.values() for e in entities})
        keys: dict[str, str] = {n: k for n, k in self.session.execute(text(
            "select u.n, knowledge.normalize_name(u.n) from unnest(cast(:n as text[])) as u(n)"),
            {"n": names}).all() if k is not None} if names else {}

        def key(name: str) -> str:
            return keys.get(name, "\0" + name)  # no key (no letter or digit): its own

        for scopes, entities in wanted.items():
            if not entities:
                continue
            # One entity per name in a scope set, whatever type the tagger gave each mention
            # (rules 15): the small model calls "Node.js" a place in one sentence and an
            # organisation in the next. A name's mentions go to the oldest entity of that name
            # the chunk's readers can read, whatever its type (so a tenant read under older
            # rules converges on one as its chunks are read again), else to one whose alias it
            # is, of their type only ("PR", an alias of the person Priya Raman, is no pull
            # request); failing both, it is made with the type most of them have.
            groups: dict[str, list[Entity]] = defaultdict(list)
            for e in entities:
                groups[key(e.name)].append(e)
            chosen = {key: min(group, key=lambda e: (-mentions[(scopes, e)],
                                                     TYPE_PRECEDENCE.get(e.entity_type, 99),
                                                     e.entity_type, e.name))
                      for key, group in groups.items()}
            # Sorted: resolution locks per name, and two writers must take them in one order.
            # Within the chunk's scopes: only an entity every reader of the chunk can read
            # (migration 0022), so no claim or profile carries a name its readers may not see.
            ordered = sorted(chosen.values(), key=lambda e: (e.entity_type, e.name.lower(), e.name))
            with savepoint(self.session):
                ids = self.session.execute(text(
                    # The name, any type, by its index; else resolve_entity_within (the
                    # type's name or alias, or a new one). One lookup with an OR of the alias
                    # read every entity of the tenant per name: 2-5 s a batch on a tenant of
                    # 5,000 entities.
                    "select u.i, case when u.c or r.id is null or " + _KNOWN_APART
                    + " then r.id end "
                    "from (select v.*, knowledge.normalize_name(v.n) as k "
                    "from unnest(cast(:t as text[]), cast(:n as text[]), cast(:c as boolean[])) "
                    "with ordinality as v(t, n, c, i)) as u "
                    "cross join lateral (select coalesce((select e.id from knowledge.entities e "
                    "where e.tenant_id = auth.tenant_id() and e.name_key = u.k "
                    "and e.merged_into is null and e.scopes @> cast(:s as uuid[]) "
                    "order by e.created_at, e.id limit 1), "
                    "knowledge.resolve_entity_within(u.t, u.n, cast(:s as uuid[]), u.c)) as id) "
                    "as r order by u.i"),
                    {"s": list(scopes), "m": self.model, "t": [e.entity_type for e in ordered],
                     "n": [e.name for e in ordered],
                     "c": [not all(entities[x] for x in groups[key(e.name)]) for e in ordered]}
                ).all()
            resolved: dict[str, uuid.UUID] = {}
            for (_, eid), e in zip(ids, ordered, strict=True):
                if eid is not None:
                    resolved[key(e.name)] = eid
                    for variant in groups[key(e.name)]:
                        self.entity_ids[(scopes, variant.entity_type, variant.name)] = eid
            self._merge_same_names(scopes, resolved)
            if self.gates:
                # Only names the rules could type otherwise: most batches ask nothing more.
                no_person = {resolved[key(name)] for sc, name in unpersoned
                             if sc == scopes and key(name) in resolved}
                self._retype([resolved[key(e.name)] for e in ordered if key(e.name) in resolved
                              and (resolved[key(e.name)] in no_person
                                   or any(typed_by_rules(e.name, t) != t for t in RETYPED))],
                             no_person)
        aliases: list[tuple[uuid.UUID, str, list[uuid.UUID]]] = []
        for (scopes, short), full in stands_for.items():
            eid = self.entity_ids[(scopes, "person", full)]
            self.entity_ids[(scopes, short.entity_type, short.name)] = eid
            aliases.append((eid, short.name, list(scopes)))
        # The first name becomes the person's alias, so a question that says "Priya" seeds
        # "Priya Raman" and later mentions resolve to her in SQL too.
        self._add_aliases(aliases)
        return [self._named(chunk, sentences) for chunk, sentences in zip(batch, read_, strict=True)]

    def _retype(self, ids: list[uuid.UUID], no_person: frozenset[uuid.UUID] | set[uuid.UUID]
                = frozenset()) -> None:
        """The entities this batch resolved to, each given the type the current rules give its
        name where an older rule typed it otherwise (``typed_by_rules``): a name's mentions go
        to the oldest entity of that name, so "Node.js", a place before rules 18, stayed one in
        every tenant read before them. Only an entity that is the extractor's alone
        (``_extractor_only``): one someone made or wrote about keeps the type it has. One query
        to read the types; an update per change, in a savepoint (one the database refuses is
        logged and left as it was). ``ids``: those whose name the rules could type otherwise
        (for one of ``RETYPED``), as the batch writes it; ``no_person``: those of them a
        mention of which the rules made a product by what its document writes
        (``Entity.unpersoned``: "Dispatcher", a word the document also writes in lower case),
        which a person becomes."""
        if not ids:
            return
        rows = self.session.execute(text(
            "select e.id, e.entity_type, e.canonical_name from knowledge.entities e "
            "where e.tenant_id = auth.tenant_id() and e.id = any(cast(:ids as uuid[])) "
            f"and e.merged_into is null and {_extractor_only('e')}"), {"ids": ids}).all()
        for eid, old, name in rows:
            new = "product" if old == "person" and eid in no_person else typed_by_rules(name, old)
            if new == old:
                continue
            try:
                with savepoint(self.session):
                    done = self.session.execute(text(
                        "update knowledge.entities set entity_type = :new "
                        "where tenant_id = auth.tenant_id() and id = :id and entity_type = :old "
                        "returning id"), {"new": new, "id": eid, "old": old}).first()
            except Unavailable:
                raise
            except EngramError as exc:
                log.warning("extract: entity %s (%r) keeps its type %s, not %s: %s", eid, name,
                            old, new, exc)
                continue
            self.report.retyped += done is not None

    def _merge_same_names(self, scopes: tuple[uuid.UUID, ...], resolved: dict[str, uuid.UUID]
                          ) -> None:
        """Rules 15 for a tenant read under older rules: each other entity of a name this batch
        resolved (``resolved``: name key -> the entity its mentions go to) is merged into that
        one (``knowledge.merge_entities``: its claims and aliases move, its id still resolves)
        where both are shared into exactly ``scopes`` (no alias reaches other readers) and
        everything ever said about it is the extractor's and no note gives it an alias: an
        entity someone made or wrote about by hand stays as it is. Each merge in its own
        savepoint: one the database refuses is logged, counted in the run's line and left
        apart; the others and the reading go on."""
        if not resolved:
            return
        pairs = self.session.execute(text(
            "select m.survivor, d.id "
            "from unnest(cast(:k as text[]), cast(:i as uuid[])) as m(k, survivor) "
            "join knowledge.entities e on e.tenant_id = auth.tenant_id() "
            "and e.id = m.survivor and e.scopes @> cast(:s as uuid[]) "
            "and e.scopes <@ cast(:s as uuid[]) "
            "join knowledge.entities d on d.tenant_id = auth.tenant_id() "
            "and d.name_key = m.k and d.id <> m.survivor and d.merged_into is null "
            "and d.scopes @> cast(:s as uuid[]) and d.scopes <@ cast(:s as uuid[]) "
            f"and {_extractor_only('d')} "
            "order by m.k, d.created_at, d.id"),
            {"k": list(resolved), "i": list(resolved.values()), "s": list(scopes)}).all()
        for survivor, merged in pairs:
            try:
                with savepoint(self.session):
                    self.session.execute(text("select knowledge.merge_entities(:s, :m)"),
                                         {"s": survivor, "m": merged})
            except Unavailable:
                raise
            except EngramError as exc:
                log.warning("extract: entity %s stays apart from %s, of the same name: %s",
                            merged, survivor, exc)
                self.report.merges_refused += 1
                continue
            self.report.merged += 1

    def _named(self, chunk: _Chunk, sentences: list[Sentence]) -> list[Sentence]:
        """``sentences`` without the mentions no entity was resolved for (and the relations
        and sentences that held only them)."""
        def known(e: Entity | None) -> bool:
            return e is None or (chunk.scopes, e.entity_type, e.name) in self.entity_ids

        out = []
        for s in sentences:
            if all(known(e) for e in s.entities):
                out.append(s)
                continue
            self.report.openers_skipped += sum(not known(e) for e in s.entities)
            entities = [e for e in s.entities if known(e)]
            if entities:
                out.append(replace(s, entities=entities, relations=[
                    r for r in s.relations if known(r.subject) and known(r.object)]))
        return out

    def _document_aliases(self, batch: Sequence[_Chunk]) -> list[GivenAliases]:
        """What each document of the batch gives now (``ingest.aliases``): its front matter
        aliases (Obsidian's ``aliases: [Priya, PR]`` on the note "Priya Raman") for the entity
        its title names: the one of that name shared into exactly the document's scopes (a
        person first), else the title read as one entity (``nlp.title_entity``), resolved or
        made in those scopes. A title that is no name ("Billing migration") and no entity's
        names nothing; a document without aliases gives none (what it gave before goes)."""
        out: list[GivenAliases] = []
        seen: set[uuid.UUID] = set()
        for chunk in batch:
            if chunk.document_id is None or chunk.document_id in seen:
                continue
            seen.add(chunk.document_id)
            if not chunk.aliases:
                out.append(GivenAliases(chunk.document_id))
                continue
            scopes = list(chunk.scopes)
            subject = chunk.subject
            with savepoint(self.session):  # one statement: the entity named so, else the title's
                eid = self.session.execute(text(
                    "select coalesce((select e.id from knowledge.entities e "
                    "where e.tenant_id = auth.tenant_id() and e.merged_into is null "
                    "and e.name_key = knowledge.normalize_name(:t) "
                    "and e.scopes @> cast(:s as uuid[]) and e.scopes <@ cast(:s as uuid[]) "
                    "order by (e.entity_type = 'person') desc, e.created_at, e.id limit 1), "
                    "case when cast(:type as text) is not null then knowledge.resolve_entity_within("
                    "cast(:type as text), cast(:name as text), cast(:s as uuid[]), true) end)"),
                    {"t": chunk.title, "s": scopes,
                     "type": subject.entity_type if subject is not None else None,
                     "name": subject.name if subject is not None else None}).scalar()
            if eid is None and chunk.title_failed:
                continue  # a title no rule could read takes back nothing its note gave before
            out.append(GivenAliases(chunk.document_id, eid, tuple(chunk.aliases), tuple(scopes)))
            if eid is not None:
                # The chunk's extraction record names the entity too: what the run took
                # from the document, whether or not a sentence of the chunk names it.
                self.titled[chunk.id] = eid
        return out

    def _add_aliases(self, aliases: list[tuple[uuid.UUID, str, list[uuid.UUID]]]) -> None:
        """Each (entity, name, scopes of the text that gives it): the name becomes the entity's
        alias only when the entity is shared into exactly those scopes (one shared wider would
        show readers of other scopes what this text calls it), within the cap of
        ck_entities_aliases_count; an entity this run may not write keeps its aliases."""
        if aliases:
            with savepoint(self.session):
                # One row per entity (an UPDATE ... FROM applies one matching row per target:
                # a person given two names in one run kept one), each name once by its key.
                self.session.execute(text(
                    "with given as (select u.id, u.name, "
                    "cast(string_to_array(u.scopes, ',') as uuid[]) as scopes "
                    "from unnest(cast(:ids as uuid[]), cast(:names as text[]), "
                    "cast(:scopes as text[])) as u(id, name, scopes)), "
                    "fresh as (select e.id, array_agg(g.name order by g.name) as names "
                    "from knowledge.entities e cross join lateral ("
                    "select distinct on (knowledge.normalize_name(g.name)) g.name from given g "
                    "where g.id = e.id and e.scopes <@ g.scopes "
                    "and knowledge.normalize_name(g.name) is not null "
                    "and not (knowledge.normalize_name(g.name) = any(e.alias_keys)) "
                    "and e.name_key <> knowledge.normalize_name(g.name) "
                    "order by knowledge.normalize_name(g.name), g.name) g "
                    "where e.tenant_id = auth.tenant_id() and e.id = any(cast(:ids as uuid[])) "
                    "group by e.id) "
                    "update knowledge.entities e "
                    "set aliases = e.aliases || f.names[1:200 - cardinality(e.aliases)] "
                    "from fresh f where e.tenant_id = auth.tenant_id() and e.id = f.id "
                    "and cardinality(e.aliases) < 200"),
                    {"ids": [i for i, _, _ in aliases], "names": [n for _, n, _ in aliases],
                     "scopes": [",".join(str(x) for x in sc) for _, _, sc in aliases]})

    def _short_names(self, batch: Sequence[_Chunk], read_: Sequence[list[Sentence]]
                     ) -> dict[tuple[tuple[uuid.UUID, ...], Entity], str]:
        """(scopes, one-word mention) -> the known person it stands for (``nlp.short_name_targets``):
        the people of two or more words this batch names in the same scopes, and those of the
        tenant every reader of the chunk can read (one query per scope set). A one-word
        mention of any type that a note's front matter gives as the alias of exactly one such
        person (``given_aliases``: "Tomás", typed a place, on the note "Tomás Ortega" with
        ``aliases: [Tomás]``) stands for that person: the writer said so."""
        people: dict[tuple[uuid.UUID, ...], set[str]] = defaultdict(set)
        shorts: dict[tuple[uuid.UUID, ...], set[Entity]] = defaultdict(set)
        words_of: dict[tuple[uuid.UUID, ...], set[Entity]] = defaultdict(set)
        for chunk, sentences in zip(batch, read_, strict=True):
            for s in sentences:
                for e in s.entities:
                    if e.entity_type == "person" and " " in e.name:
                        people[chunk.scopes].add(e.name)
                        continue
                    if (chunk.scopes, e.entity_type, e.name) in self.entity_ids:
                        continue
                    if short_name(e):
                        shorts[chunk.scopes].add(e)
                    if e.name.isalpha() and e.name[:1].isupper():
                        words_of[chunk.scopes].add(e)
        out: dict[tuple[tuple[uuid.UUID, ...], Entity], str] = {}
        for scopes, mentions in shorts.items():
            words = sorted({name_word_key(e.name) for e in mentions})
            known = self.session.execute(text(
                "select canonical_name from knowledge.entities "
                "where tenant_id = auth.tenant_id() and entity_type = 'person' "
                "and merged_into is null and scopes @> cast(:s as uuid[]) "
                "and strpos(name_key, ' ') > 0 and (split_part(name_key, ' ', 1) = any(:w) "
                "or regexp_replace(name_key, '^.* ', '') = any(:w))"),
                {"s": list(scopes), "w": words}).scalars().all()
            for e, full in short_name_targets(mentions, people[scopes] | set(known)).items():
                out[(scopes, e)] = full
        for scopes, mentions in words_of.items():
            given: dict[str, set[str]] = defaultdict(set)
            for key, full in self.session.execute(text(
                    "select a.key, e.canonical_name from knowledge.entities e cross join lateral ("
                    "select distinct knowledge.normalize_name(x) as key "
                    "from jsonb_each(e.given_aliases) g "
                    "cross join lateral jsonb_array_elements_text(case jsonb_typeof(g.value) "
                    "when 'array' then g.value else '[]'::jsonb end) x) a "
                    "where e.tenant_id = auth.tenant_id() and e.entity_type = 'person' "
                    "and e.merged_into is null and e.given_aliases <> '{}'::jsonb "
                    "and e.scopes @> cast(:s as uuid[]) and a.key = any(:w)"),
                    {"s": list(scopes),
                     "w": sorted({name_word_key(e.name) for e in mentions})}).all():
                given[key].add(full)
            for e in mentions:
                found = given.get(name_word_key(e.name), set())
                if len(found) == 1:
                    out[(scopes, e)] = next(iter(found))
        return out

    def _facts(self, chunk: _Chunk, sentences: list[Sentence]) -> list[FactInput]:
        scopes = tuple(self.scope_names[s] for s in chunk.scopes)
        facts: dict[tuple[Any, ...], FactInput] = {}

        def add(subject: uuid.UUID, predicate: str, sentence: str, *, value: Any = None,
                object_id: uuid.UUID | None = None) -> None:
            key = (subject, predicate, object_id, value, sentence)
            facts.setdefault(key, FactInput(
                subject_id=subject, predicate=predicate, text=sentence, scopes=scopes, value=value,
                object_id=object_id, confidence=EXTRACTED_CONFIDENCE, author_role=AUTHOR_ROLE))

        named = [list(dict.fromkeys(self.entity_ids[(chunk.scopes, e.entity_type, e.name)]
                                    for e in s.entities)) for s in sentences]
        # Where an entity is named is said with the first sentence of the chunk that says
        # something about it; a heading or a bare list of names only where nothing does.
        said: dict[uuid.UUID, str] = {}
        for s, ids in zip(sentences, named, strict=True):
            if s.says:
                for eid in ids:
                    said.setdefault(eid, s.text[:2000])
        mentioned: set[uuid.UUID] = set()
        for s, ids in zip(sentences, named, strict=True):
            sentence = s.text[:2000]
            for eid in ids:
                if eid not in mentioned:
                    mentioned.add(eid)
                    add(eid, "mentioned_in", said.get(eid, sentence), value=chunk.where)
                for when in s.dates:
                    add(eid, when.predicate, sentence, value=when.value)
            ordered = sorted(ids) if len(ids) <= CO_MENTION_LIMIT else []  # a list: no pairs
            for i, a in enumerate(ordered):
                for b in ordered[i + 1:]:
                    add(a, "co_mentioned_with", sentence, object_id=b)
            for r in s.relations:
                subject = self.entity_ids[(chunk.scopes, r.subject.entity_type, r.subject.name)]
                if r.object is not None:
                    target = self.entity_ids[(chunk.scopes, r.object.entity_type, r.object.name)]
                    if target != subject:
                        add(subject, r.predicate, sentence, object_id=target)
                elif r.literal is not None:
                    add(subject, r.predicate, sentence, value=r.literal)
        return list(facts.values())

    def _previous(self, chunk_ids: Sequence[uuid.UUID]
                  ) -> tuple[dict[uuid.UUID, dict[tuple[Any, ...], uuid.UUID]], list[uuid.UUID]]:
        """The current claims earlier runs wrote for these chunks, by what they say, and the
        surplus: a second claim of a chunk that says the same (two entities of one name, each
        with its claim, merged into one: ``_merge_same_names``), to retract."""
        if not chunk_ids:
            return {}, []
        rows = self.session.execute(text(
            "select e.chunk_id, c.id, c.subject_id, c.predicate, c.object_id, c.object_value, "
            "c.object_datatype, t.text, c.scopes "
            "from memory.extractions e cross join lateral unnest(e.claim_ids) as x(id) "
            "join knowledge.fact_claim c on c.tenant_id = e.tenant_id and c.id = x.id "
            "join knowledge.fact_content t on t.tenant_id = c.tenant_id and t.id = c.content_id "
            "where e.chunk_id = any(cast(:ids as uuid[])) and c.superseded_at is null"),
            {"ids": list(chunk_ids)}).all()
        out: dict[uuid.UUID, dict[tuple[Any, ...], uuid.UUID]] = defaultdict(dict)
        surplus: list[uuid.UUID] = []
        for r in sorted(rows, key=lambda r: (str(r.chunk_id), str(r.id))):
            said = out[r.chunk_id]
            key = _old_key(r.subject_id, r.predicate, r.object_id, r.object_value,
                           r.object_datatype, r.text, r.scopes)
            if key in said:
                surplus.append(r.id)
            else:
                said[key] = r.id
        return out, surplus

    def write(self, batch: Sequence[_Chunk], read_: Sequence[list[Sentence]]) -> None:
        read_ = self._resolve(batch, read_)
        previous, vanished = self._previous([c.id for c in batch if c.read_before])
        new: list[tuple[int, FactInput]] = []
        kept: list[list[uuid.UUID]] = [[] for _ in batch]
        for i, (chunk, sentences) in enumerate(zip(batch, read_, strict=True)):
            old = dict(previous.get(chunk.id, {}))
            for fact in self._facts(chunk, sentences):
                value, datatype = ("", "entity") if fact.value is None else literal_value(fact.value, None)
                key = _old_key(fact.subject_id, fact.predicate, fact.object_id,
                               None if fact.value is None else value, datatype, fact.text, chunk.scopes)
                if key in old:
                    kept[i].append(old.pop(key))
                else:
                    new.append((i, fact))
            vanished += old.values()
        results = assert_facts(self.session, [f for _, f in new])
        claims: list[list[uuid.UUID]] = [[] for _ in batch]
        held: list[list[uuid.UUID]] = [[] for _ in batch]
        for (i, fact), result in zip(new, results, strict=True):
            if result.claim_id is not None:
                claims[i].append(result.claim_id)
                self.report.claims.append(result.claim_id)
                if fact.predicate.startswith("mentioned_") and fact.predicate != "mentioned_in":
                    self.report.dates += 1
                elif fact.predicate not in BOOKKEEPING_PREDICATES:
                    self.report.relations += 1
            elif result.quarantine_id is not None:
                held[i].append(result.quarantine_id)
                self.report.quarantined.append(result.quarantine_id)
        record_derivations(self.session, [
            (("knowledge.fact_claim", {"id": str(cid)}), ("sources.chunks", {"id": str(chunk.id)}))
            for chunk, ids in zip(batch, claims, strict=True) for cid in ids])
        self._records([
            {"chunk_id": chunk.id, "content_hash": chunk.content_hash, "scopes": list(chunk.scopes),
             "model": self.model,
             "entity_ids": sorted({self.entity_ids[(chunk.scopes, e.entity_type, e.name)]
                                   for s in sentences for e in s.entities}
                                  | ({self.titled[chunk.id]} if chunk.id in self.titled else set())),
             "claim_ids": kept[i] + claims[i], "quarantine_ids": held[i]}
            for i, (chunk, sentences) in enumerate(zip(batch, read_, strict=True))])
        self.report.retracted += retract_claims(self.session, vanished)
        self.report.kept += sum(len(k) for k in kept)
        self.report.chunks += len(batch)
        for chunk, sentences in zip(batch, read_, strict=True):
            self.report.entities |= {self.entity_ids[(chunk.scopes, e.entity_type, e.name)]
                                     for s in sentences for e in s.entities}
            if chunk.id in self.titled:
                self.report.entities.add(self.titled[chunk.id])

    def write_each(self, batch: Sequence[_Chunk], read_: Sequence[list[Sentence]]) -> None:
        """The item-by-item run (``poison``): each chunk alone; a chunk whose writes the database
        refuses is rolled back alone, skipped, and recorded as read with nothing taken from it,
        so the next run does not stumble on it again (a new version of it is read afresh)."""
        for chunk, sentences in zip(batch, read_, strict=True):
            known = dict(self.entity_ids)
            with poison.item(self.session, f"chunk {chunk.id} of {chunk.where}",
                             restore=self.report) as done:
                self.write([chunk], [sentences])
            if done.skipped:
                self.entity_ids = known  # entities made in the rolled-back item are gone
                self.nothing_taken(chunk)

    def nothing_taken(self, chunk: _Chunk) -> None:
        """``chunk`` skipped (its writes refused, or no rule could read its text): recorded as
        read with nothing taken from it, so the next run does not stumble on it again (a new
        version of it is read afresh, and so is every chunk when the rules change)."""
        self.report.skipped_chunks += 1
        with poison.item(self.session, f"the extraction record of chunk {chunk.id}"):
            self._records([{"chunk_id": chunk.id, "content_hash": chunk.content_hash,
                            "scopes": list(chunk.scopes), "model": self.model, "entity_ids": [],
                            "claim_ids": [], "quarantine_ids": []}])

    def _records(self, values: list[dict[str, Any]]) -> None:
        stmt = insert(Extraction).values(values)
        self.session.execute(stmt.on_conflict_do_update(
            index_elements=[Extraction.tenant_id, Extraction.chunk_id],
            set_={name: stmt.excluded[name] for name in ("content_hash", "scopes", "model", "entity_ids",
                                                         "claim_ids", "quarantine_ids")}
            | {"extracted_at": func.now()}))

    def withdraw(self, chunks: Sequence[_Chunk]) -> None:
        """Documents that opted out: what was read from them stops being current."""
        ids = [c.id for c in chunks]
        claims = self.session.execute(text(
            "select x.id from memory.extractions e cross join lateral unnest(e.claim_ids) as x(id) "
            "where e.chunk_id = any(cast(:ids as uuid[]))"), {"ids": ids}).scalars().all()
        self.report.retracted += retract_claims(self.session, list(claims))
        self.session.execute(text(
            "delete from memory.extractions where chunk_id = any(cast(:ids as uuid[]))"), {"ids": ids})
        self.report.aliases_removed += give_document_aliases(self.session, [
            GivenAliases(d) for d in {c.document_id for c in chunks if c.document_id is not None}
        ])
        self.report.opted_out += len(chunks)


def extract_all(sessions: Callable[[], Any], settings: Settings, *,
                document_ids: Sequence[uuid.UUID] | None = None, limit: int | None = None,
                on_progress: Progress | None = None) -> ExtractReport:
    """Runs of at most ``derive_extract_limit`` chunks, each its own transaction from
    ``sessions()``, until nothing is waiting (or ``limit`` chunks in all were read)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise BadInput(f"limit must be a positive integer, not {limit!r}")
    total: int | None = None
    report: ExtractReport | None = None
    done = 0
    while True:
        step = settings.derive_extract_limit if limit is None else min(settings.derive_extract_limit,
                                                                        limit - done)
        base = done

        def one_run(session: Session, base: int = base, step: int = step) -> ExtractReport:
            nonlocal total
            if total is None:
                total = pending_chunks(session, document_ids=document_ids, settings=settings)
                if limit is not None:
                    total = min(total, limit)
                if on_progress is not None:
                    on_progress(0, total)
            of = total

            def progress(n: int, _of: int) -> None:
                if on_progress is not None:
                    on_progress(base + n, max(of, base + n))

            return extract(session, document_ids=document_ids, limit=step, settings=settings,
                           on_progress=progress)

        # One chunk the database refuses must not stop the others: poison.run_guarded.
        run, skipped = poison.run_guarded(sessions, one_run, what="extract")
        run.skipped = list(skipped)
        if report is None:
            report = run
        else:
            report.add(run)
        read = run.chunks + run.opted_out + run.skipped_chunks
        done += read
        if not run.more or (limit is not None and done >= limit) or read == 0:
            return report


# What wakes ``ExtractOnIngest`` besides embedded chunks: chunks to read again whose text did
# not change (a note's front matter aliases, its scopes), which the embedding queue never
# sees; ``engram worker run`` listens on it beside the queue's channel.
EXTRACT_CHANNEL = "engram_extract"


def wake_extraction(session: Session) -> None:
    """Ask a running worker to extract now (delivered when ``session`` commits)."""
    session.execute(select(func.pg_notify(EXTRACT_CHANNEL, "")))


class ExtractOnIngest:
    """Extraction right after ingest, in ``engram worker run``.

    The embedding queue calls ``wake()`` when it has embedded new chunks (it woke on
    their NOTIFY), and so does a NOTIFY on ``EXTRACT_CHANNEL`` (``wake_extraction``:
    chunks to read again that need no embedding); this thread then waits
    ``extract_wake_delay_s`` for the rest of the burst and extracts every tenant's waiting
    chunks as the service identity, in runs of ``derive_extract_limit`` chunks, until none
    wait. The derive tick still runs the ``extract`` job too (it catches anything a missed
    wake left); both take the job lock, so they never read one chunk twice.
    """

    def __init__(self, worker_engine: Engine, app_engine: Engine, settings: Settings, *,
                 tenants: Sequence[uuid.UUID] | None = None,
                 on_report: Callable[[str, ExtractReport], None] | None = None) -> None:
        self.worker_engine = worker_engine
        self.app_engine = app_engine
        self.settings = settings
        self.tenants = list(tenants) if tenants is not None else None
        self.on_report = on_report
        self._wake = threading.Event()

    def wake(self) -> None:
        self._wake.set()

    def run_once(self) -> dict[str, ExtractReport]:
        with self.worker_engine.connect() as conn:
            tenants = service_tenants(conn, self.tenants)
        reports: dict[str, ExtractReport] = {}
        for tenant in tenants:
            if not tenant.scopes:
                continue

            def sessions(t: ServiceTenant = tenant) -> Any:
                return service_session(self.app_engine, t)

            started_at = datetime.now(UTC)
            keep = self.settings.derive_job_runs_keep_days
            try:
                r = extract_all(sessions, self.settings)
            except Exception as exc:  # one tenant's failure must not stop the others; the tick retries
                if is_unavailable(exc):
                    raise  # every tenant would fail alike: run_forever retries with back-off
                log.exception("extract on ingest: %s failed", tenant.org_id)
                poison.record_run(sessions, "extract", ok=False, line=poison.reason_of(exc), skipped=[],
                                  started_at=started_at, keep_days=keep)
                continue
            if r.skipped:
                poison.record_run(sessions, "extract", ok=True, line=r.line(), skipped=r.skipped,
                                  started_at=started_at, keep_days=keep)
            if r.chunks or r.opted_out:
                reports[tenant.org_id] = r
                log.info("extract on ingest: %s: %s", tenant.org_id, r.line())
                if self.on_report is not None:
                    self.on_report(tenant.org_id, r)
        return reports

    def run_forever(self, stop: threading.Event, component: Component | None = None) -> None:
        """Wait for a wake, extract, repeat. A run that fails (the database restarting) is
        retried with back-off without waiting for the next wake; ``component`` reports it."""
        component = component or Component("extraction on ingest")
        component.ok("waiting for new chunks")

        def body() -> None:
            while not stop.is_set():
                if not self._wake.wait(timeout=1.0):
                    continue
                stop.wait(max(self.settings.extract_wake_delay_s, 0.0))
                self._wake.clear()
                if stop.is_set():
                    return
                try:
                    done = self.run_once()
                except Exception:
                    self._wake.set()  # the retry after the back-off extracts what waited
                    raise
                component.ok(f"last run: {sum(r.chunks for r in done.values())} chunks read")

        supervise(component, body, stop)
