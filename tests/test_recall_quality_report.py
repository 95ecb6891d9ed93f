"""The recall_quality benchmark's report over CV seeds (benchmarks/recall_quality.py
``--cv-seeds``): the mean and range of each figure and, per LoCoMo category, +derive - plain
seed by seed, from the replays' per-question rows."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.support.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def rq() -> ModuleType:
    return load_benchmark("recall_quality")


def _rows(values: list[float]) -> list[dict[str, float]]:
    return [{"recall@10": v, "ndcg@10": v / 2} for v in values]


def test_the_seeds_report_gives_mean_range_and_the_derive_difference_per_category(
        rq: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    part = rq.Part("locomo")
    part.categories[""] = [1, 1, 2]
    part.categories[" +derive"] = [1, 1, 2]
    # Seed 7 ("learned (CV)") and seed 8: category 1 (two questions), category 2 (one).
    part.results["engram: learned (CV)"] = _rows([0.4, 0.6, 1.0])          # cat 1: 0.5
    part.results["engram: learned (CV) +derive"] = _rows([0.6, 0.6, 0.8])  # cat 1: 0.6
    part.results["engram: learned (CV seed 8)"] = _rows([0.2, 0.6, 1.0])   # cat 1: 0.4
    part.results["engram: learned (CV seed 8) +derive"] = _rows([0.2, 0.4, 1.0])  # 0.3
    part.results["engram: fused"] = _rows([0.0, 0.0, 0.0])  # no seeds: not in the summary
    rq.print_seeds(part)
    out = capsys.readouterr().out
    assert "learned (CV) over 2 seeds: mean [min, max]" in out
    # plain R@10 per seed: (0.4+0.6+1.0)/3 = 0.667, (0.2+0.6+1.0)/3 = 0.6
    assert "plain    R@10 0.633 [0.600, 0.667]" in out, out
    diff = next(line for line in out.splitlines() if "+derive - plain, seed by seed" in line)
    # cat 1: +0.1 (seed 7), -0.1 (seed 8); cat 2: -0.2, 0.0
    assert "0.000 [-0.100, 0.100]" in diff and "-0.100 [-0.200, 0.000]" in diff, diff
    held = next(line for line in out.splitlines() if "seeds where +derive >= plain" in line)
    assert held.split()[-2:] == ["1/2", "1/2"], held


def test_one_seed_prints_no_seeds_report(rq: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    part = rq.Part("locomo")
    part.categories[""] = [1]
    part.results["engram: learned (CV)"] = _rows([0.5])
    rq.print_seeds(part)
    assert capsys.readouterr().out == ""


def test_a_seed_count_below_one_is_refused(rq: ModuleType) -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="must be at least 1"):
        rq._positive("0")
    with pytest.raises(argparse.ArgumentTypeError, match="not a whole number"):
        rq._positive("two")
