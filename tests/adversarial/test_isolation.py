"""Isolation fuzz: random identities read every registered surface of a random world; no word,
id or count of a row an identity cannot read may appear in anything it is shown.

The world (``build``) is two tenants with the same scope names, rows in random scope sets with
unique secret words, and everything the embedding queue and the derive jobs made of them. Each
identity gets random read and write subsets (some none, one an auditor) and one of the tenant's
questions, several of which name people the identity may not read. Counts are checked against
the model too: the documents and entities a listing pages through, and the visible corpus the
trace reports.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, pool, text

from orchestrator.api.mcp import build_server
from orchestrator.auth import Identity
from orchestrator.auth.tokens import TokenVerifier
from orchestrator.client import Engram
from orchestrator.config import Settings
from orchestrator.db.server import free_port
from orchestrator.recall import Recaller
from tests.adversarial.build import SCOPES, build_world
from tests.adversarial.figures import record
from tests.adversarial.surfaces import SURFACES, Probe, without_echo
from tests.adversarial.world import SECRET, World, subset
from tests.conftest import TenantFixture, TestDatabase
from tests.support.api import ApiServer

IDENTITIES_PER_TENANT = 3
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
CORPUS = re.compile(r"lexical corpus \(visible\): (\d+) chunks")


@pytest.fixture(scope="module")
def world(seed: int, api_server: ApiServer, tenant_factory: Callable[..., TenantFixture],
          test_db: TestDatabase, app_engine: Engine, admin_engine: Engine, settings: Settings,
          embedder: Any) -> World:
    wall, cpu = time.perf_counter(), time.process_time()
    built = build_world(seed, api_server, tenant_factory, test_db, app_engine, admin_engine,
                        settings, embedder)
    record("seconds", world_build_wall=round(time.perf_counter() - wall),
           world_build_cpu=round(time.process_time() - cpu))
    return built


@dataclass
class Leak:
    surface: str
    user: str
    found: str

    def __str__(self) -> str:
        return f"{self.surface} as {self.user}: {self.found}"


def identities(world: World, rng: random.Random) -> Iterator[Identity]:
    for tenant in world.tenants:
        for n in range(IDENTITIES_PER_TENANT):
            read, write = subset(rng, SCOPES, 0, 2), subset(rng, SCOPES, 0, 1)
            roles = frozenset({"auditor"}) if n == 0 else frozenset({"dba"}) if n == 1 else frozenset()
            yield Identity(tenant.org, f"u{rng.randint(0, 3)}", frozenset(read), frozenset(write), roles)


def token_for(server: ApiServer, ident: Identity) -> str:
    scopes = [f"read:{s}" for s in sorted(ident.read_scopes)] + \
             [f"write:{s}" for s in sorted(ident.write_scopes)] + \
             (["engram:auditor"] if "auditor" in ident.roles else []) + \
             (["engram:dba"] if "dba" in ident.roles else [])
    return server.token(ident.org_id, ident.user_id, tuple(scopes))


def cli_env(server: ApiServer) -> dict[str, str]:
    s = server.settings
    # ENGRAM_API_URL: a port nothing listens on, so `engram recall` answers in the process, from
    # this world's database; without it, an `engram up` on the default port (a developer's)
    # answered the probe's commands with 401s and the CLI surface probed nothing of the world.
    env = {"ENGRAM_HOME": str(s.home), "ENGRAM_DB_PORT": str(s.db_port), "ENGRAM_DB_NAME": s.db_name,
           "ENGRAM_AUTH_DEV_KEY_PATH": str(s.auth_dev_key_path), "ENGRAM_AUTH_TRUST_DEV_KEY": "true",
           "ENGRAM_API_URL": f"http://127.0.0.1:{free_port()}"}
    for name in ("database_url", "app_password"):
        if getattr(s, name):
            env[f"ENGRAM_{name.upper()}"] = getattr(s, name)
    return env


@dataclass(frozen=True)
class Forbidden:
    """What one identity must never be shown: secret words, ids (all, or other tenants')."""

    words: frozenset[str]
    ids: frozenset[str]
    foreign_ids: frozenset[str]

    @classmethod
    def of(cls, world: World, ident: Identity) -> Forbidden:
        return cls(frozenset(world.forbidden_words(ident)), frozenset(world.forbidden_ids(ident)),
                   frozenset(world.forbidden_ids(ident, own_tenant=False)))

    def look(self, world: World, who: str, surface: str, text_: str, metadata: bool) -> list[Leak]:
        low = text_.lower()
        words = set(SECRET.findall(low)) & self.words
        ids = set(UUID.findall(low)) & (self.foreign_ids if metadata else self.ids)
        return [Leak(surface, who, f"word {w}") for w in sorted(words)] + \
               [Leak(surface, who, f"id {i} ({world.rows[i].table})") for i in sorted(ids)]


def test_no_surface_shows_a_word_id_or_count_of_an_unreadable_row(
        world: World, seed: int, api_server: ApiServer, app_engine: Engine, admin_engine: Engine,
        test_db: TestDatabase, settings: Settings) -> None:
    rng = random.Random(seed ^ 0x15)
    verifier = TokenVerifier.from_settings(api_server.settings)
    recaller = Recaller(app_engine, api_server.settings)
    leaks: list[Leak] = []
    internal: list[str] = []
    reads = counts = mismatches = people = 0
    for ident in identities(world, rng):
        people += 1
        token = token_for(api_server, ident)
        mcp = build_server(lambda t=token: Engram(app_engine, t, api_server.settings, verifier=verifier,  # type: ignore[misc]
                                                  recaller=recaller, channel="mcp"))
        probe = Probe(world, ident, token, api_server, mcp, cli_env(api_server),
                      rng.choice(world.questions[ident.org_id]))
        forbidden = Forbidden.of(world, ident)
        who = f"{ident.org_id}/{ident.user_id} read {sorted(ident.readable)}"
        for registered in SURFACES.values():
            start = len(probe.exchanges)
            for _ in registered.run(probe) or ():
                pass
            for sent, shown in probe.exchanges[start:]:
                reads += 1
                leaks += forbidden.look(world, who, registered.name, without_echo(sent, shown),
                                        registered.metadata)
                match = CORPUS.search(shown)
                if match:  # the trace's corpus: the chunks this identity can read, no more
                    counts += 1
                    if int(match.group(1)) != len(world.readable(ident, "sources.chunks")):
                        mismatches += 1
                        leaks.append(Leak(registered.name, ident.user_id,
                                          f"corpus of {match.group(1)} chunks"))
        internal += probe.internal
        for field_, table in (("documents", "sources.documents"), ("entities", "knowledge.entities")):
            counts += 1
            listed = _listed(probe, field_)
            if listed != len(world.readable(ident, table)):
                mismatches += 1
                leaks.append(Leak(f"graphql {field_}", ident.user_id,
                                  f"count {listed}, readable {len(world.readable(ident, table))}"))
    leaks += _auditor_exports(world, test_db, admin_engine)
    record("isolation", identities=people, surfaces=len(SURFACES), reads=reads,
           rows=len(world.rows), secrets=len(world.holders), count_checks=counts,
           leaks=len(leaks), internal_errors=len(internal))
    assert not internal, "\n".join(internal[:20])
    assert not leaks, f"{len(leaks)} leaks (seed {seed}):\n" + "\n".join(map(str, leaks[:40]))
    assert mismatches == 0


def _listed(probe: Probe, field_: str) -> int:
    extra = "includeHidden: true, " if field_ == "documents" else ""
    total, after = 0, None
    while True:
        data = probe.gql_data(f"query($a: String) {{ c: {field_}({extra}first: 100, after: $a) "
                              "{ edges { node { id } } pageInfo { hasNextPage endCursor } } }",
                              {"a": after})
        total += len(data["c"]["edges"])
        if not data["c"]["pageInfo"]["hasNextPage"]:
            return total
        after = data["c"]["pageInfo"]["endCursor"]


def _auditor_exports(world: World, test_db: TestDatabase, admin_engine: Engine) -> list[Leak]:
    """What an auditor's tools print (PROV-O export, receipt checks): keys and hashes, never a
    secret word, and never another tenant's row."""
    from orchestrator.audit.export import export
    from orchestrator.audit.receipts import verify_receipt

    auditor = create_engine(test_db.database.role_url("engram_auditor"), poolclass=pool.NullPool)
    every_word = set(world.holders)
    leaks: list[Leak] = []
    try:
        with auditor.connect() as conn:
            for tenant in world.tenants:
                others = {r.id for r in world.rows.values() if r.org != tenant.org}
                shown = export(conn, tenant.id, "jsonld")
                with admin_engine.connect() as admin:
                    receipts = admin.execute(text("select id from provenance.receipts where "
                                                  "tenant_id = :t"), {"t": tenant.id}).scalars().all()
                shown += "".join(json.dumps(verify_receipt(conn, r).__dict__, default=str)
                                 for r in receipts)
                low = shown.lower()
                leaks += [Leak("audit export and receipts", tenant.org, f"word {w}")
                          for w in sorted(set(SECRET.findall(low)) & every_word)]
                leaks += [Leak("audit export and receipts", tenant.org, f"id {i}")
                          for i in sorted(set(UUID.findall(low)) & others)]
    finally:
        auditor.dispose()
    return leaks
