"""Recall: one typed statement over every lane, a short Python tail, one rendered string.

``recall(identity, question, asker, budget_tokens, mode)`` is the entry point and
``memory_prepare`` its bundle for prompts;
``build_recall_statement`` the statement; ``Recaller.trace`` the debugging view.
See ``docs/recall.md``.
"""

from orchestrator.recall.plan import FULL_PLAN, PLAN_STUDY, PlanShape
from orchestrator.recall.prepare import PreparedMemory
from orchestrator.recall.result import (
    Evidence,
    FactRef,
    Provenance,
    RecallResult,
    ScopeRef,
    SourceRef,
)
from orchestrator.recall.service import Recaller, memory_prepare, recall
from orchestrator.recall.statement import StatementLimits, build_recall_statement

__all__ = [
    "FULL_PLAN", "PLAN_STUDY", "Evidence", "FactRef", "PlanShape", "PreparedMemory", "Provenance",
    "RecallResult", "Recaller", "ScopeRef", "SourceRef", "StatementLimits", "build_recall_statement",
    "memory_prepare", "recall",
]
