"""The GraphQL documents the console runs: the only way it reads or changes anything."""

from __future__ import annotations

ME = "{ me { orgId userId readScopes writeScopes roles } }"

EVIDENCE = """text provenance kind author scopes { name } source { collection path title }
  documentId itemTable itemId"""
ITEM = "key kind label direct pinned lanes rrf rerank merit section"
TRACE = f"""shape question asker mode sessionId budgetTokens usedTokens kept rendered neededTokens
  statements text
  evidence {{ {EVIDENCE} }}
  timings {{ stage ms }} corpusChunks corpusAvgLength seeds
  pools {{ lane items {{ {ITEM} }} }}
  fused {{ {ITEM} }}
  hydrationDropped {{ label reason rrf }}
  reranker
  precedence {{ action reason item {{ {ITEM} }} }}
  ordered {{ {ITEM} }}
  suppressed {{ label twin similarity }}
  touchedClaims receiptId steps {{ name data text idle }}"""

RECALL_FORM = "{ planShapes { name lanes rerank } }"


def recall_trace(shapes: list[str]) -> str:
    """One trace of the full plan and one per study shape, side by side (aliases s0, s1, ...)."""
    args = ("question: $q, asker: $asker, budgetTokens: $budget, mode: $mode, "
            "sessionId: $session")
    study = "\n".join(
        f's{n}: recallTrace({args}, shape: "{name}") {{ shape usedTokens kept '
        f"timings {{ stage ms }} ordered {{ key kind label direct merit }} }}"
        for n, name in enumerate(shapes))
    return (f"query($q: String!, $asker: String, $budget: Int, $mode: String, $session: String) "
            f"{{ full: recallTrace({args}) {{ {TRACE} }}\n{study} }}")


SCOPE = "name description canRead canWrite"
DOCUMENTS = """query($after: String, $collection: String, $hidden: Boolean) {
  documents(first: 25, after: $after, collection: $collection, includeHidden: $hidden) {
    edges { node { id collection path title kind state pinned snoozedUntil archivedAt
                     updatedAt chunkCount embedding { state } scopes { name } } }
    pageInfo { hasNextPage endCursor } } }"""
DOCUMENT = f"""query($id: ID!, $direction: String) {{
  documentById(id: $id) {{ id collection path title kind state area body author pinned
    snoozedUntil archivedAt createdAt updatedAt chunkCount
    embedding {{ state chunksTotal chunksEmbedded chunksFailed }} scopes {{ {SCOPE} }} }}
  readableLineage(table: "sources.documents", id: $id, direction: $direction) {{
    nodes {{ table id label }} edges {{ relation derivedTable derivedId sourceTable sourceId depth }}
  }} }}"""
PIN = "mutation($id: ID!, $on: Boolean!) { pin(id: $id, pinned: $on) { id } }"
ARCHIVE = "mutation($id: ID!, $on: Boolean!) { archive(id: $id, archived: $on) { id } }"
SNOOZE = "mutation($id: ID!, $until: DateTime) { snooze(id: $id, until: $until) { id } }"
LINEAGE = """query($table: String!, $id: ID!, $direction: String) {
  readableLineage(table: $table, id: $id, direction: $direction) {
    nodes { table id label } edges { relation derivedTable derivedId sourceTable sourceId depth } } }"""

ENTITIES = """query($q: String, $after: String) { entities(query: $q, first: 25, after: $after) {
  edges { node { id type name aliases scopes { name } } } pageInfo { hasNextPage endCursor } } }"""
FACT = """id text predicate objectId objectValue objectDatatype epistemicKind perspectiveKey author
  authorRole confidence authority validFrom validTo recordedAt factKey asOf disputed beatenBy"""
ENTITY = f"""query($id: ID!) {{ entityById(id: $id) {{ id type name aliases summary mergedInto
  createdBy createdAt scopes {{ name }} }}
  facts(entityId: $id, includeBeaten: true) {{ {FACT} }} }}"""
KEYED = f"{{ keyedFacts {{ {FACT} }} }}"
CONFLICTS = f"""query($status: String) {{ conflicts(status: $status) {{ id kind predicate status
  strategy winnerId detectedAt a {{ {FACT} }} b {{ {FACT} }} }} }}"""
RESOLVE = """mutation($id: ID!, $strategy: String!, $winner: ID) {
  resolveConflict(id: $id, strategy: $strategy, winner: $winner) { winner } }"""
QUARANTINE = """query($status: String) { quarantine(status: $status) { id reasons payload status
  releasedClaimId createdAt author } }"""
RELEASE = """mutation($id: ID!, $corrections: JSON) { releaseQuarantine(id: $id, corrections: $corrections) {
  claimId quarantined reasons } }"""
DISCARD = "mutation($id: ID!) { discardQuarantine(id: $id) { id status } }"
DERIVED = """query($kind: String) { derivedItems(kind: $kind) { table id kind text createdAt
  scopes { name } } }"""

AUDIT = """{ chainHead { seq hash recordedAt anchor } receipts(first: 15) { id askedBy askedAt
  evidenceCount } }"""
VERIFY_STEP = """query($from: Int!, $limit: Int!) { verifyChainStep(fromSeq: $from, limit: $limit) {
  fromSeq checked lastSeq headSeq done ok brokenAt problem rowProblems } }"""
ANCHORS = "query($a: String!) { checkAnchors(anchors: $a) { seq ok problem } }"
RECEIPT = """query($id: ID!) { receipt: verifyReceipt(id: $id) { id askedBy askedAt seal proven ok problems
  evidence { table rowId served status } } }"""
PROVENANCE = """query($table: String!, $rowId: JSON!, $direction: String) {
  provenance(table: $table, rowId: $rowId, direction: $direction) { proven
    nodes { table rowId eventSeqs }
    edges { relation derivedTable derivedRowId sourceTable sourceRowId depth eventSeq } } }"""
EXPORT = "query($format: String) { provenanceExport(format: $format) }"

OPERATIONS = f"""{{ me {{ orgId userId readScopes writeScopes roles }} scopes {{ {SCOPE} }}
  embedQueue(hours: 24, buckets: 12) {{ tables {{ table pending failed ready lastHour lastError }} }}
  models {{ embeddingModel reranker loaded rerankerAvailable rerankerNote device
            registry {{ name dimension active activatedAt }} }} }}"""
DERIVE_RUNS = "{ deriveRuns { job ok source startedAt seconds summary error } }"
CHARTS = """{ recallLatency { count p50 p95 buckets { le count } }
  embedQueue(hours: 24, buckets: 24) { series { at depth embedded } }
  documentValue(days: 30, first: 15) { id title path uses marks days } }"""
