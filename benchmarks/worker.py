"""Worker throughput: embedding passages/s and reranking pairs/s, in-process and served.

    .venv/bin/python benchmarks/worker.py                 # small defaults, < 2 min on 2 CPUs
    .venv/bin/python benchmarks/worker.py --tokens 64,256,512 --batch-sizes 1,2,4,8,16,32,64 \
        --texts 256 --reranker-path /models/bge-reranker-v2-m3

Texts are built to an exact token count with the model's own tokenizer. The
embedding model is the packaged all-MiniLM-L6-v2 (its window is 256 tokens, so
512-token passages are truncated by the model: the row says so). No
cross-encoder ships in a package, so unless ``--reranker-path`` is given the
reranker is a randomly initialised MiniLM-L6-sized BERT cross-encoder (6
layers, 384 wide, 512 positions): its scores are meaningless, its cost is that
of a real one of that size. Every figure is a ratio against a baseline measured
in the same run (batch size 1; in-process), so machines can be compared by
shape, not by absolute numbers. On a machine with CUDA the same grid runs on
the GPU as well.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

WORDS = (
    "memory", "engine", "agent", "recall", "scope", "tenant", "document", "chunk", "vector",
    "lexical", "graph", "community", "profile", "decision", "episode", "observation",
    "provenance", "chain", "audit", "token", "budget", "summary", "question", "answer",
    "reason", "outcome", "confidence", "project", "area", "state",
)


def texts_of(tokenizer: Any, tokens: int, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) + str(rng.randint(0, 99)) for _ in range(tokens)]
        ids = tokenizer(" ".join(words), add_special_tokens=False)["input_ids"][: tokens - 2]
        out.append(tokenizer.decode(ids))
    return out


def timed(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up: allocator, kernels, first-call caches
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def build_cross_encoder(target: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from orchestrator.worker.models import packaged_embedding_path

    tok = AutoTokenizer.from_pretrained(str(packaged_embedding_path()), local_files_only=True)
    tok.model_max_length = 512
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=384, num_hidden_layers=6,
                        num_attention_heads=12, intermediate_size=1536,
                        max_position_embeddings=512, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(str(target))
    tok.save_pretrained(str(target))
    return target


def one_question(embedder: Any, tokenizer: Any, n: int) -> None:
    """A recall's question (16 tokens): ``embed_query`` (the traced one-text path where it was
    built) against sentence-transformers' ``encode`` of the same text, alternating, p50 ms."""
    questions = texts_of(tokenizer, 16, n, seed=16)
    embedder.embed_query(questions[0])  # builds the one-text path
    model = embedder._model
    fast, slow, diff = [], [], 0.0
    for q in questions:
        t0 = time.perf_counter()
        got = embedder.embed_query(q)
        t1 = time.perf_counter()
        want = model.encode([embedder.format_query(q)], normalize_embeddings=True,
                            convert_to_numpy=True, show_progress_bar=False)[0]
        t2 = time.perf_counter()
        fast.append(t1 - t0)
        slow.append(t2 - t1)
        diff = max(diff, float(abs(got - want).max()))
    f, s = statistics.median(fast) * 1000, statistics.median(slow) * 1000
    print(f"\none question, 16 tokens, {n} questions (p50 ms): embed_query "
          f"({embedder.one_text_path or 'encode'}) {f:.2f}, encode {s:.2f}, ratio {f / s:.2f}; "
          f"largest difference {diff:.1e}")


def run_device(device: str, args: argparse.Namespace, reranker_path: Path) -> None:
    from orchestrator.config import Settings
    from orchestrator.worker.embedder import Embedder, Reranker

    settings = Settings(device=device, reranker_model="bench-cross-encoder",
                        reranker_model_path=reranker_path, reranker_max_length=512)
    embedder = Embedder.from_settings(settings)
    reranker = Reranker.from_settings(settings)
    tokenizer = embedder._model.tokenizer
    print(f"\n== {device}: {embedder.model_name} ({embedder.dimension}-d, window "
          f"{embedder.max_seq_length}); reranker {reranker.model_name} window {reranker.max_length}")

    one_question(embedder, tokenizer, args.questions)

    print("\nembedding (passages/s; ratio vs batch 1 at the same length)")
    print(f"{'tokens':>7} {'batch':>6} {'passages/s':>11} {'vs b=1':>7}  note")
    for tokens in args.tokens:
        texts = texts_of(tokenizer, tokens, max(args.texts, max(args.batch_sizes)), seed=tokens)
        base = None
        for b in args.batch_sizes:
            embedder.batch_size = b
            n = max(args.texts, b)

            def one_pass(b: int = b, n: int = n, texts: list[str] = texts) -> None:
                for i in range(0, n, b):
                    embedder.embed_passages(texts[i: i + b])

            rate = n / timed(one_pass, args.repeats)
            base = base or rate
            note = (f"truncated to {embedder.max_seq_length}" if tokens > embedder.max_seq_length
                    else "")
            print(f"{tokens:>7} {b:>6} {rate:>11.1f} {rate / base:>7.2f}  {note}")

    print("\nreranking (pairs/s; ratio vs batch 1 at the same length)")
    print(f"{'tokens':>7} {'batch':>6} {'pairs/s':>11} {'vs b=1':>7}")
    query = "which decision changed the project's budget?"
    for tokens in args.tokens:
        passages = texts_of(tokenizer, tokens - 16, max(args.pairs, max(args.batch_sizes)),
                            seed=tokens + 1)
        base = None
        for b in args.batch_sizes:
            reranker.batch_size = b
            n = max(args.pairs, b)

            def one_pass(n: int = n, passages: list[str] = passages) -> None:
                reranker.score(query, passages[:n])

            rate = n / timed(one_pass, args.repeats)
            base = base or rate
            print(f"{tokens:>7} {b:>6} {rate:>11.1f} {rate / base:>7.2f}")

    served(settings, embedder, reranker, tokenizer, args)


def served(settings: Any, embedder: Any, reranker: Any, tokenizer: Any,
           args: argparse.Namespace) -> None:
    import httpx
    import uvicorn

    from orchestrator.db.server import free_port
    from orchestrator.worker.server import create_app

    embedder.batch_size = 32
    reranker.batch_size = 16
    port = free_port()
    app = create_app(settings.model_copy(update={"worker_batch_wait_ms": args.wait_ms}),
                     embedder=embedder, reranker=reranker)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(url + "/readyz").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    texts = texts_of(tokenizer, 64, args.texts, seed=99)
    client = httpx.Client(base_url=url, timeout=300)

    print("\nin-process vs served (64-token passages)")
    print(f"{'workload':<44} {'in-proc/s':>10} {'served/s':>10} {'ratio':>6}")
    for b in (1, 16):
        def local(b: int = b) -> None:
            for i in range(0, len(texts), b):
                embedder.embed_passages(texts[i: i + b])

        def remote(b: int = b) -> None:
            for i in range(0, len(texts), b):
                r = client.post("/embed", json={"texts": texts[i: i + b]})
                r.raise_for_status()

        lr = len(texts) / timed(local, args.repeats)
        rr = len(texts) / timed(remote, args.repeats)
        print(f"{f'embed, one caller, batch {b}':<44} {lr:>10.1f} {rr:>10.1f} {rr / lr:>6.2f}")

    callers = args.callers

    def concurrent() -> None:
        def one(t: str) -> None:
            with httpx.Client(base_url=url, timeout=300) as c:
                c.post("/embed", json={"texts": [t]}).raise_for_status()
        with ThreadPoolExecutor(callers) as pool:
            list(pool.map(one, texts))

    def local_single() -> None:
        for t in texts:
            embedder.embed_passages([t])

    lr = len(texts) / timed(local_single, args.repeats)
    before = len(app.state.worker.embed_batcher.batch_sizes)
    rr = len(texts) / timed(concurrent, args.repeats)
    sizes = app.state.worker.embed_batcher.batch_sizes[before:]
    label = f"embed, {callers} callers x 1 text (micro-batched)"
    print(f"{label:<44} {lr:>10.1f} {rr:>10.1f} {rr / lr:>6.2f}"
          f"   mean batch {statistics.mean(sizes):.1f}")
    passages = texts_of(tokenizer, 240, 8, seed=7)

    def rlocal() -> None:
        reranker.score(query_text, passages)

    def rremote() -> None:
        client.post("/rerank", json={"query": query_text, "passages": passages}).raise_for_status()

    query_text = "which decision changed the budget?"
    lr = len(passages) / timed(rlocal, args.repeats)
    rr = len(passages) / timed(rremote, args.repeats)
    print(f"{'rerank, 8 pairs of 256 tokens':<44} {lr:>10.1f} {rr:>10.1f} {rr / lr:>6.2f}")
    client.close()
    server.should_exit = True
    thread.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    parser.add_argument("--tokens", type=ints, default=[64, 256, 512])
    parser.add_argument("--batch-sizes", type=ints, default=[1, 8, 64])
    parser.add_argument("--texts", type=int, default=32, help="passages per embedding measurement")
    parser.add_argument("--pairs", type=int, default=8, help="pairs per rerank measurement")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--questions", type=int, default=60, help="questions for the one-question row")
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--wait-ms", type=float, default=4.0)
    parser.add_argument("--reranker-path", type=Path, default=None)
    parser.add_argument("--device", default=None, help="cpu or cuda; default: cpu, and cuda too "
                        "when available")
    args = parser.parse_args()

    import torch

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.reranker_path or build_cross_encoder(Path(tmp) / "cross-encoder")
        devices = [args.device] if args.device else (
            ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
        for device in devices:
            run_device(device, args, path)
    print(f"\ntotal {time.perf_counter() - started:.0f}s; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")


if __name__ == "__main__":
    main()
