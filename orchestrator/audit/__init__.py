"""Provenance for auditors: the hash chain, PROV-O lineage and recall receipts.

The chain itself is kept by PostgreSQL (``db/versions/0006_provenance.py``):
every write to a memory table appends an event by trigger, so nothing here
writes chain events. This package reads and checks them:

* ``chain``: verify a tenant's chain (``provenance.verify_chain``) and its
  current rows against it (``provenance.verify_rows``); head hashes to anchor
  outside the database, and checking anchors later;
* ``canonical``: the canonical forms in Python, so that an auditor can recompute
  event hashes from exported events without trusting the database's functions;
* ``lineage``: agents, activities and derivation edges (the API that ingest,
  derive and the worker call), and lineage walks backward to origins and
  forward to what was derived, each step with the chain events that prove it;
* ``receipts``: recall receipts, appended by recall and re-derived here;
* ``export``: W3C PROV-O as JSON-LD or Turtle (rdflib).

Auditor functions take a ``Connection`` or ``Session`` of any role that may read
the provenance schema (``engram_auditor`` in production); application functions
take a ``bound_session``.
"""
