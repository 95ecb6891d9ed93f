"""W3C PROV-O export (JSON-LD or Turtle) of a tenant's provenance, built with rdflib.

The mapping (``docs/provenance.md``):

* each chain event that writes a row makes a ``prov:Entity`` for that row
  *version* (``urn:engram:<tenant>:version:<row hash>``), a
  ``prov:specializationOf`` the row itself, ``prov:wasRevisionOf`` the previous
  version of the same row, ``prov:generatedAtTime``, ``prov:wasAttributedTo``
  the acting user and ``prov:wasGeneratedBy`` the event's activity; a DELETE
  sets ``prov:invalidatedAtTime`` on the last version;
* activities are ``prov:Activity`` with start and end, ``prov:wasAssociatedWith``
  the user who ran them and their agent (service or model);
* agents are ``prov:Person``, ``prov:SoftwareAgent`` or ``prov:Organization``;
  a model is also a ``prov:Entity`` so that an embedding can be derived from it;
* each derivation edge links the two pinned versions with ``prov:wasDerivedFrom``
  (or its sub-properties ``wasQuotedFrom``, ``wasRevisionOf``,
  ``hadPrimarySource``), and its activity ``prov:used`` the source.

Chain facts that PROV-O has no term for (sequence number, hashes) use the
``urn:engram:vocab:`` namespace. Only ``provenance`` tables are read, so an
auditor can export without seeing any memory row.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal
from urllib.parse import quote

from rdflib import RDF, RDFS, XSD, Graph, Namespace, URIRef
from rdflib import Literal as RdfLiteral
from rdflib.namespace import PROV
from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from orchestrator.errors import BadInput

ENGRAM = Namespace("urn:engram:vocab:")
Executor = Connection | Session
Format = Literal["jsonld", "ttl"]

_AGENT_TYPES = {"person": PROV.Person, "software": PROV.SoftwareAgent, "model": PROV.SoftwareAgent,
                "organization": PROV.Organization}
_RELATIONS = {"wasDerivedFrom": PROV.wasDerivedFrom, "wasQuotedFrom": PROV.wasQuotedFrom,
              "wasRevisionOf": PROV.wasRevisionOf, "hadPrimarySource": PROV.hadPrimarySource}


def _json_key(row_id: dict[str, Any]) -> str:
    import json

    return json.dumps(row_id, sort_keys=True, separators=(",", ":"))


class Names:
    """The URIs of one tenant's things."""

    def __init__(self, tenant: uuid.UUID) -> None:
        self.base = f"urn:engram:{tenant}:"

    def version(self, digest: bytes) -> URIRef:
        return URIRef(f"{self.base}version:{digest.hex()}")

    def row(self, table: str, row_id: dict[str, Any]) -> URIRef:
        return URIRef(f"{self.base}row:{table}:{quote(_json_key(row_id), safe='')}")

    def activity(self, activity: uuid.UUID) -> URIRef:
        return URIRef(f"{self.base}activity:{activity}")

    def agent(self, agent: uuid.UUID) -> URIRef:
        return URIRef(f"{self.base}agent:{agent}")

    def user(self, user: str) -> URIRef:
        return URIRef(f"{self.base}user:{quote(user, safe='')}")


def _time(value: Any) -> RdfLiteral:
    return RdfLiteral(value.isoformat(), datatype=XSD.dateTime)


def build_graph(conn: Executor, tenant: uuid.UUID) -> Graph:
    g = Graph()
    g.bind("prov", PROV)
    g.bind("engram", ENGRAM)
    n = Names(tenant)
    params = {"t": tenant}

    for a in conn.execute(text("select * from provenance.agents where tenant_id = :t"), params).all():
        node = n.agent(a.id)
        g.add((node, RDF.type, PROV.Agent))
        g.add((node, RDF.type, _AGENT_TYPES[a.kind]))
        if a.kind == "model":
            g.add((node, RDF.type, PROV.Entity))
        g.add((node, RDFS.label, RdfLiteral(a.name)))
        if a.version:
            g.add((node, ENGRAM.version, RdfLiteral(a.version)))

    for a in conn.execute(text("select * from provenance.activities where tenant_id = :t"), params).all():
        node = n.activity(a.id)
        g.add((node, RDF.type, PROV.Activity))
        g.add((node, ENGRAM.kind, RdfLiteral(a.kind)))
        g.add((node, PROV.startedAtTime, _time(a.started_at)))
        if a.ended_at is not None:
            g.add((node, PROV.endedAtTime, _time(a.ended_at)))
        if a.actor_user:
            g.add((node, PROV.wasAssociatedWith, n.user(a.actor_user)))
            g.add((n.user(a.actor_user), RDF.type, PROV.Agent))
        if a.agent_id is not None:
            g.add((node, PROV.wasAssociatedWith, n.agent(a.agent_id)))

    last: dict[tuple[str, str], URIRef] = {}
    for e in conn.execute(text("select * from provenance.events where tenant_id = :t order by seq"),
                          params).all():
        key = (e.table_name, _json_key(e.row_id))
        if e.operation == "DELETE":
            if key in last:
                g.add((last.pop(key), PROV.invalidatedAtTime, _time(e.recorded_at)))
            continue
        v = n.version(bytes(e.row_hash))
        g.add((v, RDF.type, PROV.Entity))
        g.add((v, PROV.specializationOf, n.row(e.table_name, e.row_id)))
        g.add((n.row(e.table_name, e.row_id), RDF.type, PROV.Entity))
        g.add((v, PROV.generatedAtTime, _time(e.recorded_at)))
        g.add((v, ENGRAM.table, RdfLiteral(e.table_name)))
        g.add((v, ENGRAM.chainSeq, RdfLiteral(e.seq, datatype=XSD.long)))
        g.add((v, ENGRAM.eventHash, RdfLiteral(bytes(e.hash).hex())))
        g.add((v, ENGRAM.operation, RdfLiteral(e.operation)))
        if e.actor_user:
            g.add((v, PROV.wasAttributedTo, n.user(e.actor_user)))
            g.add((n.user(e.actor_user), RDF.type, PROV.Agent))
        if e.activity_id is not None:
            g.add((v, PROV.wasGeneratedBy, n.activity(e.activity_id)))
        if key in last and last[key] != v:
            g.add((v, PROV.wasRevisionOf, last[key]))
        last[key] = v

    for d in conn.execute(text("select * from provenance.derivations where tenant_id = :t"), params).all():
        derived = n.version(bytes(d.derived_version))
        g.add((derived, RDF.type, PROV.Entity))
        source = (n.version(bytes(d.source_version)) if d.source_version is not None
                  else n.agent(d.source_agent_id))
        g.add((derived, _RELATIONS[d.relation], source))
        if d.relation != "wasDerivedFrom":
            g.add((derived, PROV.wasDerivedFrom, source))
        if d.activity_id is not None:
            g.add((n.activity(d.activity_id), PROV.used, source))
    return g


def export(conn: Executor, tenant: uuid.UUID, fmt: Format = "jsonld") -> str:
    if fmt not in ("jsonld", "ttl"):
        raise BadInput(f"format {fmt!r} is not jsonld or ttl")
    g = build_graph(conn, tenant)
    if fmt == "ttl":
        return g.serialize(format="turtle")
    return g.serialize(format="json-ld", context={"prov": str(PROV), "engram": str(ENGRAM)}, indent=2)
