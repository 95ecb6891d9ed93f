# PostgreSQL 18 with pgvector, VectorChord (vchord), pg_tokenizer and vchord_bm25:
# the production index tier. Engram's migrations detect these extensions and
# build vchordrq + BM25 indexes instead of HNSW + GIN.
FROM tensorchord/vchord-suite:pg18-latest

# VectorChord must be preloaded; pg_tokenizer and vchord_bm25 are loaded on use.
RUN echo "shared_preload_libraries = 'vchord,pg_tokenizer'" >> /usr/share/postgresql/postgresql.conf.sample

HEALTHCHECK --interval=10s --timeout=5s --retries=10 \
  CMD pg_isready -U "${POSTGRES_USER:-postgres}" -d "${POSTGRES_DB:-engram}" || exit 1
