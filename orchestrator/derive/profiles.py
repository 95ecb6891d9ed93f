"""Profiles: per person entity and per user, a summary of their current facts, preferences and opinions.

Three kinds of profile, each **per scope set** (the claims about one subject
shared into exactly the same scopes are summarised together and the profile
carries that scope set, so a reader of a profile can read every claim it draws
on, and nobody else can read the profile). A profile of an entity is titled
with its name, so it is built only when the entity is shared into every scope
of the set (anyone who reads the profile can read the entity); otherwise it is
withheld and counted (``ProfileReport.withheld``):

* a person's **world profile** (``perspective_key = 'world'``): the current world
  facts about a person entity;
* a person **in one creator's view** (``perspective_key = 'user:<creator>'``): the
  opinions, preferences, experiences and observations that creator recorded about
  the person. Claims of those kinds live in their creator's perspective partition
  (``knowledge.fact_claim.perspective_key``), so each creator's view is its own
  profile: two people's opinions of the same person are never summarised
  together, and neither reaches the world profile;
* a **user's own profile** (``subject_user_id``): everything in that user's
  partition, i.e. their own experiences, preferences and opinions, whatever they
  are about. The database puts a user profile in that user's partition
  (``tg_profiles__perspective``); the derive service's own partition has none.

``input_digest`` fingerprints a profile's input (subject, partition, name and
its claims' ids and texts). A profile whose digest and summary method are
unchanged is not re-summarised (with an abstractive endpoint that is one call
saved per profile and tick) and not rewritten. A changed one is re-summarised
and written only when something stored differs; the requeue trigger puts a
changed summary back on the embedding queue, which is how a changed profile is
re-embedded. Every profile written anew records ``wasDerivedFrom`` edges to
exactly the claims it was made from.

One run is one transaction under the job lock (``service.job_lock``); the
partial unique indexes of 0017 back it up (one profile per subject, partition
and scope set), so two concurrent runs can never both insert a profile.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import delete, func, insert, or_, select, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import Session

from orchestrator.audit.lineage import begin_activity, end_activity, record_derivations
from orchestrator.config import Settings
from orchestrator.db.knowledge_models import Entity, Profile, current_claims
from orchestrator.derive import poison
from orchestrator.derive.digest import form_of, input_digest
from orchestrator.derive.quality import (
    mask_markup,
    plausible_entity,
    plausible_statement,
    says_more_than,
)
from orchestrator.derive.service import SERVICE_USER, job_lock
from orchestrator.derive.summarize import get_summarizer

JOB = "profiles"
PERSON = "person"
WORLD = "world"
PERSPECTIVE_KINDS = ("experience", "observation", "opinion", "preference")
Progress = Callable[[int, int], None]
# (entity id or None, user id or None, perspective key, scope set)
Key = tuple[uuid.UUID | None, str | None, str, tuple[uuid.UUID, ...]]


@dataclass
class ProfileReport:
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    resummarised: int = 0  # summarizer calls
    users: int = 0  # user profiles among the profiles now current
    # (subject, partition, scope set) groups not summarised: the subject entity is not shared
    # into every scope of its claims, so the profile's title would name it to readers who
    # may not read it (a stored one is deleted)
    withheld: int = 0


@dataclass(frozen=True)
class _Stored:
    id: uuid.UUID
    summary: str
    method: str
    model: str | None
    digest: bytes | None


def _sort_key(key: Key) -> tuple[str, str, str, tuple[str, ...]]:
    entity, user, perspective, scopes = key
    return (str(entity or ""), user or "", perspective, tuple(str(s) for s in scopes))


def _holder(perspective: str) -> str:
    return perspective.removeprefix("user:")


def _title(key: Key, names: dict[uuid.UUID, str]) -> str:
    entity, user, perspective, _ = key
    if entity is None:
        return f"{user}, in their own words"
    if perspective == WORLD:
        return names[entity]
    return f"{names[entity]}, as {_holder(perspective)} sees it"


def refresh(session: Session, *, max_sentences: int = 5, settings: Settings | None = None,
            on_progress: Progress | None = None) -> ProfileReport:
    """Build or refresh every writable profile: of person entities and of users. A profile of
    an entity that is no longer a person (typed otherwise by newer extraction rules: "Long
    Term Support", stop 45) or that was merged into another is deleted with the others that
    no current claim makes.

    ``on_progress(done, total)`` is called after each profile is considered (for a progress bar).
    """
    summarizer = get_summarizer(settings)
    job_lock(session, JOB)
    uuids = ARRAY(UUID(as_uuid=True))
    c = current_claims.c
    writable = c.scopes.contained_by(func.auth.write_scopes(type_=uuids))
    wanted: dict[Key, list[tuple[uuid.UUID, str]]] = defaultdict(list)
    names: dict[uuid.UUID, str] = {}
    about_people = session.execute(
        select(c.id, c.subject_id, c.scopes, c.text, c.perspective_key, Entity.canonical_name,
               Entity.scopes)
        .join(Entity, (Entity.tenant_id == c.tenant_id) & (Entity.id == c.subject_id))
        .where(Entity.entity_type == PERSON, Entity.merged_into.is_(None), writable,
               or_(c.epistemic_kind == "world_fact", c.epistemic_kind.in_(PERSPECTIVE_KINDS)))
        .order_by(c.id)
    ).all()
    gates = settings.derive_quality_gates if settings is not None else True
    withheld: set[Key] = set()
    for claim_id, subject, scopes, text_, perspective, name, subject_scopes in about_people:
        # Quality gates (orchestrator.derive.quality): no profile of a name that is code, a
        # URL or a number, and no sentence in it that is not prose.
        if gates:
            masked = mask_markup(text_)  # once, for both tests
            if (not plausible_entity(name) or not plausible_statement(text_, masked)
                    or not says_more_than(text_, name, masked)):
                continue
        key: Key = (subject, None, perspective, tuple(sorted(scopes)))
        # The title names the subject: only when every reader of the profile (anyone with
        # one of its scopes) may read the subject's row, i.e. the entity is shared into
        # every scope of the claims. Otherwise no profile: its title would carry a name
        # from a row some of its readers cannot read.
        if not set(scopes) <= set(subject_scopes):
            withheld.add(key)
            continue
        wanted[key].append((claim_id, text_))
        names[subject] = name
    own = session.execute(
        select(c.id, c.author, c.scopes, c.text)
        .where(c.epistemic_kind.in_(PERSPECTIVE_KINDS), c.author != SERVICE_USER, writable)
        .order_by(c.id)
    ).all()
    for claim_id, author, scopes, text_ in own:
        if gates and not plausible_statement(text_):
            continue
        wanted[(None, author, f"user:{author}", tuple(sorted(scopes)))].append((claim_id, text_))

    stored_rows = session.execute(
        select(Profile.id, Profile.subject_entity_id, Profile.subject_user_id, Profile.perspective_key,
               Profile.scopes, Profile.summary, Profile.summary_method, Profile.summary_model,
               Profile.input_digest)
        .where(Profile.scopes.contained_by(func.auth.write_scopes(type_=uuids)))
    ).all()
    existing: dict[Key, _Stored] = {
        (r.subject_entity_id, r.subject_user_id, r.perspective_key, tuple(sorted(r.scopes))): _Stored(
            r.id, r.summary, r.summary_method, r.summary_model,
            None if r.input_digest is None else bytes(r.input_digest))
        for r in stored_rows}

    report = ProfileReport(users=sum(1 for k in wanted if k[1] is not None), withheld=len(withheld))
    wanted_method = (summarizer.method, summarizer.model)
    keys = sorted(set(wanted) | set(existing), key=_sort_key)
    edges = []
    started = False

    def start() -> None:
        nonlocal started
        if not started:
            begin_activity(session, "derive.profiles", {
                "method": summarizer.method, "model": summarizer.model, "entity_type": PERSON})
            started = True

    for done, key in enumerate(keys, 1):
        if on_progress is not None:
            on_progress(done, len(keys))
        facts = wanted.get(key)
        old = existing.get(key)
        if not facts:
            assert old is not None
            start()
            session.execute(delete(Profile).where(Profile.id == old.id))
            report.deleted += 1
            continue
        title = _title(key, names)
        made_of = ("profile", title, max_sentences, facts)
        digest = input_digest(*made_of, *form_of(summarizer.method))
        if old is not None and old.digest == digest and (old.method, old.model) == wanted_method:
            report.unchanged += 1
            continue
        made = summarizer.summarize([t for _, t in facts], max_sentences=max_sentences)
        report.resummarised += 1
        # The digest of what made it (an endpoint that failed falls back to extractive).
        digest = input_digest(*made_of, *form_of(made.method))
        summary = f"{title}: {made.text}"
        if old is not None and (old.summary, old.method, old.model, old.digest) == (
                summary, made.method, made.model, digest):
            report.unchanged += 1
            continue
        start()
        written = {"summary": summary, "summary_method": made.method, "summary_model": made.model,
                   "input_digest": digest}
        entity, user, perspective, scopes = key
        label = f"the profile of {f'entity {entity}' if entity else f'user {user}'} ({perspective})"
        with poison.item(session, label, restore=report):
            if old is not None:
                session.execute(update(Profile).where(Profile.id == old.id)
                                .values(updated_at=func.now(), **written))
                pid = old.id
                report.updated += 1
            else:
                pid = session.execute(insert(Profile).values(
                    subject_entity_id=entity, subject_user_id=user, perspective_key=perspective,
                    scopes=list(scopes), **written).returning(Profile.id)).scalar_one()
                report.inserted += 1
            derived = ("memory.profiles", {"id": str(pid)})
            edges += [(derived, ("knowledge.fact_claim", {"id": str(cid)})) for cid, _ in facts]
    if edges:
        record_derivations(session, edges)
    if started:
        end_activity(session)
    return report
