"""The Torch worker: embeddings, cross-encoder reranking and the embedding queue.

This package is the only place in Engram that imports torch,
sentence-transformers or transformers, and it does so lazily (inside the
functions that load a model), so importing ``orchestrator.worker`` stays cheap
for processes that only talk to a served worker.

* ``embedder``: ``Embedder`` (passages, asker-aware queries) and ``Reranker``
  (cross-encoder over the full chunk, in overlapping windows when needed);
* ``device``: CUDA or CPU, precision, batch sizes, torch threads;
* ``queue``: rows are the queue; claim, dedup by content hash, write back;
* ``service``: the one interface the API uses, in-process or over HTTP;
* ``server``: ``engram worker serve`` with dynamic micro-batching.
"""
