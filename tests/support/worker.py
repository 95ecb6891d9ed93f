"""Fixtures for the worker tests: a tiny cross-encoder built on the spot.

No cross-encoder ships in any package, so the reranker's mechanics are tested
with a randomly initialised BERT sequence classifier (two layers, 32 wide) that
reuses the packaged MiniLM's vocabulary. Its scores mean nothing; loading,
batching, windowing and ordering are what the tests check.
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_cross_encoder(target: Path, *, max_positions: int = 128, seed: int = 7) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from orchestrator.worker.models import packaged_embedding_path

    vocab_from = packaged_embedding_path()
    assert vocab_from is not None, "the packaged MiniLM provides the tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(str(vocab_from), local_files_only=True)
    tokenizer.model_max_length = max_positions
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=max_positions, num_labels=1)
    model = BertForSequenceClassification(config)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    return target
