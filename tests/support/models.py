"""Second embedding models for the model-change tests, built from the packaged MiniLM.

No second sentence-embedding model ships in any package, so the tests derive
real ones from the packaged weights by appending a fixed linear layer:

* ``rotated``: an orthogonal 384 x 384 rotation. Cosine similarity inside the
  model is exactly MiniLM's, so a correct recall under it ranks exactly as under
  MiniLM, while a question of one model against vectors of the other ranks by
  noise (their cross similarity is near zero): a mixed recall is visible.
* ``projected``: a random 384 -> ``dimension`` projection (Johnson-Lindenstrauss),
  a model of another dimension whose neighbourhoods stay close to MiniLM's.

Both are saved as ordinary sentence-transformers directories under
``<models_dir>/<name>``, where ``ENGRAM_EMBEDDING_MODELS_DIR`` finds a registered
name.
"""

from __future__ import annotations

from pathlib import Path

ROTATED = "tests/minilm-rotated"


def build_model(models_dir: Path, name: str, dimension: int = 384, *, seed: int = 3) -> Path:
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense

    from orchestrator.worker.models import packaged_embedding_path

    target = models_dir / name
    if (target / "config.json").exists():
        return target
    packaged = packaged_embedding_path()
    assert packaged is not None, "the packaged MiniLM is the base of the test models"
    model = SentenceTransformer(str(packaged), device="cpu", local_files_only=True)
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(dimension, 384, generator=generator)
    if dimension == 384:
        weight, _ = torch.linalg.qr(weight)
    dense = Dense(in_features=384, out_features=dimension, bias=False,
                  activation_function=torch.nn.Identity())
    with torch.no_grad():
        dense.linear.weight.copy_(weight)
    model.append(dense)
    target.mkdir(parents=True, exist_ok=True)
    model.save(str(target))
    return target
