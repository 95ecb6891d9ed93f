"""Geometry for the console's pictures, computed here so the templates only draw.

``trace_picture`` lays a recall trace out left to right: one column per lane (its pool in
rank order), then the fused (RRF) order, then the final order with the budget's cut; a line
joins each lane's item to its place in the fused order, and each fused item to its final
place. ``lineage_picture`` lays a lineage out by depth, one column per step from the start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from orchestrator.messages import near_duplicate

COL_W = 220
BOX_W = 190
ROW_H = 26
TOP = 44
PER_COLUMN = 12
LABEL_CHARS = 29
# A chunk's trace label ends with its full id ("Title #<uuid>"): the box leaves it to the
# tooltip and says the section instead, so a document's chunks do not all read alike.
_CHUNK_ID = re.compile(r" #[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# Card titles of the trace steps without a typed field (``TraceStep``); a step not named
# here (a newer one) is titled by its name.
STEP_TITLES = {
    "plan_note": "Plan", "embedding_cached": "Query embedding", "narrower": "Narrower titles",
    "catalogs": "Catalogs asked for", "unfound": "Titles no lane found",
    "ranker": "Learned ranker", "ppr": "Personalized PageRank", "ranking": "Ranking model",
    "model_id": "Tenant's model", "direct_lost": "Direct subjects' other chunks",
    "diversity": "Diversity (MMR)", "named_day": "Days the question names",
    "navigation": "Navigation pages", "deprecated": "Deprecated pages",
    "redundant": "Redundant derived items", "clipped": "Part cut to fit",
    "needed_tokens": "Budget too small", "usage_rows": "Usage ledger",
}


def step_title(name: str) -> str:
    return STEP_TITLES.get(name, name.replace("_", " "))


# Colour per lane: distinct, and dark enough for white-on-colour text (contrast >= 4.5).
PALETTE = ("#1f5fa8", "#a3431b", "#2d6a2e", "#7b3fa0", "#8a5a00", "#0f6b6b", "#9c2f5f",
           "#4a5a14", "#5a4fb0", "#7a3b2e", "#2b5d7a", "#6b4c1e")


def short(text: str, n: int = LABEL_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


@dataclass
class Box:
    x: int
    y: int
    label: str
    title: str
    color: str
    key: str = ""
    note: str = ""
    href: str | None = None


@dataclass
class Line:
    x1: int
    y1: int
    x2: int
    y2: int
    color: str


@dataclass
class Picture:
    width: int
    height: int
    columns: list[dict[str, Any]] = field(default_factory=list)
    boxes: list[Box] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    cut_y: int | None = None
    cut_x: int | None = None
    cut_label: str = ""


def duplicate_line(suppressed: dict[str, Any]) -> str:
    """One line of the trace's duplicates (GraphQL's ``suppressed``), in the text trace's
    words (``messages.near_duplicate``)."""
    return near_duplicate(str(suppressed["label"]), str(suppressed["twin"]),
                          float(suppressed["similarity"]))


def box_text(item: dict[str, Any]) -> str:
    """What a trace item's box says: its title and section, its id left to the tooltip."""
    title = _CHUNK_ID.sub("", item["label"])
    return short(f"{title} › {item['section']}" if item.get("section") else title)


def box_title(item: dict[str, Any]) -> str:
    """The box's tooltip: the whole label, and the section."""
    return str(item["label"]) + (f" (section: {item['section']})" if item.get("section") else "")


def _rank(item: dict[str, Any], lane: str) -> Any:
    lanes = item.get("lanes") or {}
    return lanes.get(f"{lane}_rank", lanes.get("title_rank") if lane == "title" else None)


def trace_picture(trace: dict[str, Any]) -> Picture:
    pools = [p for p in trace["pools"] if p["items"]]
    fused = trace["fused"][:PER_COLUMN * 2]
    ordered = trace["ordered"][:PER_COLUMN * 2]
    fused_x = len(pools) * COL_W
    final_x = fused_x + COL_W + 40
    rows = max([len(p["items"][:PER_COLUMN]) for p in pools] + [len(fused), len(ordered), 1])
    pic = Picture(width=final_x + COL_W, height=TOP + rows * ROW_H + 40)
    fused_at = {it["key"]: TOP + n * ROW_H for n, it in enumerate(fused)}
    for n, pool in enumerate(pools):
        color = PALETTE[n % len(PALETTE)]
        x = n * COL_W
        shown = pool["items"][:PER_COLUMN]
        more = len(pool["items"]) - len(shown)
        pic.columns.append({"x": x, "title": pool["lane"], "color": color,
                            "note": f"{len(pool['items'])} found" + (f", {more} not drawn"
                                                                     if more else "")})
        for r, it in enumerate(shown):
            y = TOP + r * ROW_H
            rank = _rank(it, pool["lane"])
            pic.boxes.append(Box(x, y, f"{rank if rank is not None else r + 1}. {box_text(it)}",
                                 box_title(it), color, it["key"]))
            if it["key"] in fused_at:
                pic.lines.append(Line(x + BOX_W, y + 10, fused_x, fused_at[it["key"]] + 10, color))
    pic.columns.append({"x": fused_x, "title": "fused (RRF)", "color": "#333333",
                        "note": f"{len(trace['fused'])} candidates"})
    for n, it in enumerate(fused):
        pic.boxes.append(Box(fused_x, TOP + n * ROW_H, f"{n + 1}. {box_text(it)}",
                             f"{box_title(it)} (rrf {it['rrf']:.4f})", "#333333", it["key"]))
    final_at = {it["key"]: TOP + n * ROW_H for n, it in enumerate(ordered)}
    for key, y in fused_at.items():
        if key in final_at:
            pic.lines.append(Line(fused_x + BOX_W, y + 10, final_x, final_at[key] + 10, "#777777"))
    pic.columns.append({"x": final_x, "title": "final order", "color": "#333333",
                        "note": f"kept {trace['kept']} of {len(trace['ordered'])}"})
    for n, it in enumerate(ordered):
        kept = n < trace["kept"]
        pic.boxes.append(Box(final_x, TOP + n * ROW_H, f"{n + 1}. {box_text(it)}",
                             f"{box_title(it)} (merit {it['merit']:.3f})"
                             + (" direct subject" if it["direct"] else ""),
                             "#1d5e20" if kept else "#6b6b6b", it["key"],
                             note="kept" if kept else "cut"))
    if ordered:
        pic.cut_x = final_x
        pic.cut_y = TOP + min(trace["kept"], len(ordered)) * ROW_H - 3
        pic.cut_label = f"budget: {trace['usedTokens']} of {trace['budgetTokens']} tokens"
    return pic


def timing_bar(timings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each stage's share of the total, for a stacked bar."""
    total = sum(t["ms"] for t in timings) or 1.0
    return [{"stage": t["stage"], "ms": t["ms"], "pct": 100.0 * t["ms"] / total,
             "color": PALETTE[n % len(PALETTE)]} for n, t in enumerate(timings)]


def lineage_picture(start: tuple[str, str], nodes: list[dict[str, Any]],
                    edges: list[dict[str, Any]], direction: str,
                    href: Any = None) -> Picture:
    """``nodes``: {table, id, label}; ``edges``: {derived: (table, id), source: (table, id)}.
    Columns by distance from ``start`` along the edges (back: sources to the right)."""
    depth: dict[tuple[str, str], int] = {start: 0}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for e in edges:
                near, far = (e["derived"], e["source"]) if direction == "back" else (e["source"],
                                                                                    e["derived"])
                if near == node and far not in depth:
                    depth[far] = depth[node] + 1
                    nxt.append(far)
        frontier = nxt
    by_key = {(n["table"], n["id"]): n for n in nodes}
    columns: dict[int, list[tuple[str, str]]] = {}
    for key in by_key:
        columns.setdefault(depth.get(key, max(depth.values()) + 1), []).append(key)
    rows = max((len(v) for v in columns.values()), default=1)
    pic = Picture(width=(max(columns, default=0) + 1) * (COL_W + 40),
                  height=TOP + rows * (ROW_H + 12) + 20)
    at: dict[tuple[str, str], tuple[int, int]] = {}
    tables = sorted({k[0] for k in by_key})
    colors = {t: PALETTE[n % len(PALETTE)] for n, t in enumerate(tables)}
    for d in sorted(columns):
        x = d * (COL_W + 40)
        pic.columns.append({"x": x, "title": "start" if d == 0 else f"step {d}", "color": "#333333",
                            "note": ""})
        for r, key in enumerate(sorted(columns[d])):
            y = TOP + r * (ROW_H + 12)
            at[key] = (x, y)
            n = by_key[key]
            pic.boxes.append(Box(x, y, short(n["label"] or n["id"], 22),
                                 f"{n['table']} {n['id']}: {n['label']}", colors[key[0]],
                                 note=key[0], href=href(*key) if href else None))
    for e in edges:
        if e["derived"] in at and e["source"] in at:
            (x1, y1), (x2, y2) = sorted([at[e["derived"]], at[e["source"]]])
            pic.lines.append(Line(x1 + BOX_W, y1 + 10, x2, y2 + 10, "#555555"))
    return pic
