# PostgreSQL 18 with pgvector, VectorChord (vchord), pg_tokenizer and vchord_bm25:
# the production index tier. Engram's migrations detect these extensions and
# build a vchordrq vector index instead of HNSW (docs/database.md, "Index tiers").
# Pinned to a dated release of the suite image (never a moving -latest tag); move the
# pin on purpose, then run `engram db reindex` (docs/deployment.md, "Upgrading images").
FROM tensorchord/vchord-suite:pg18-20251001

# VectorChord must be preloaded; pg_tokenizer and vchord_bm25 are loaded on use.
RUN echo "shared_preload_libraries = 'vchord,pg_tokenizer'" >> /usr/share/postgresql/postgresql.conf.sample

HEALTHCHECK --interval=10s --timeout=5s --retries=10 \
  CMD pg_isready -U "${POSTGRES_USER:-postgres}" -d "${POSTGRES_DB:-engram}" || exit 1
