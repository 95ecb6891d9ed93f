# A Citus node (coordinator or worker) with pgvector: Engram's scale-out database
# (docs/scale-out.md). Citus 14.1 builds against PostgreSQL 18 (Engram needs uuidv7()).
# Pinned; pgvector comes from the PostgreSQL apt repository the base image configures.
FROM citusdata/citus:14.1.0

ARG PGVECTOR_VERSION=0.8.*
USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends "postgresql-${PG_MAJOR}-pgvector=${PGVECTOR_VERSION}" \
 && rm -rf /var/lib/apt/lists/*
USER postgres

HEALTHCHECK --interval=10s --timeout=5s --retries=10 \
  CMD pg_isready -U "${POSTGRES_USER:-postgres}" -d "${POSTGRES_DB:-engram}" || exit 1
