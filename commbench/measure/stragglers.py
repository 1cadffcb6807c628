"""Stragglers: the rank (or node) the others consistently wait for, from the per-rank table (``ranks.csv``).

In a collective every rank finishes together, so a slow rank does not show as a longer time of its own: it shows
as the others' **waiting**. Every sample starts with a barrier; the rank that arrives last (its previous work took
longer: a busy core, a slower link) waits least there. Per (collective, size) — its precisions share their rounds — the rank with the smallest median barrier wait
is the one waited for. If no rank were special, each of n ranks would be that rank with probability 1/n; a rank (or a
node, with probability its share of the ranks) named far more often than that — a one-sided binomial test at
``alpha`` — is a straggler. Pure pandas: a view over the run directory.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

ALPHA = 1e-3
"""One-sided binomial p-value below which a rank or node is named (few false alarms over many runs)."""
MIN_POINTS = 6
"""Fewer points than this name nobody (too little evidence)."""


def binomial_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def stragglers(ranks: pd.DataFrame, alpha: float = ALPHA) -> list[dict[str, Any]]:
    """Ranks and nodes waited for significantly more often than chance, per group kind.

    Each entry: kind ("rank" or "node"), who, group, points (where it was the one waited for), of (points
    considered), share, expected share, p_value, and the median of how long the others waited for it beyond its
    own wait (``lead_us``).
    """
    out: list[dict[str, Any]] = []
    if ranks.empty or "wait_us" not in ranks.columns:
        return out
    df = ranks.assign(group=ranks["group"].fillna("world") if "group" in ranks.columns else "world")
    # the precisions of one size share their rounds, hence their waits: one observation per (collective, size)
    keys = ["collective", "payload", "fp32_bytes"]
    for group, g in df.groupby("group", sort=False):
        n_ranks = g["rank"].nunique()
        if n_ranks < 2:
            continue
        host_of = g.drop_duplicates("rank").set_index("rank")["host"]
        waited: list[tuple[int, float]] = []  # (rank waited for, how much longer the others waited)
        for _, pt in g.groupby(keys, sort=False):
            pt = pt.drop_duplicates("rank")
            if pt["rank"].nunique() < 2:
                continue
            i = pt["wait_us"].idxmin()
            others = pt.drop(index=i)["wait_us"].median()
            waited.append((int(pt.at[i, "rank"]), float(others - pt.at[i, "wait_us"])))
        total = len(waited)
        if total < MIN_POINTS:
            continue
        # who was waited for, by rank and (on several nodes) by node, with each one's share of the ranks
        by: list[tuple[str, dict[str, list[float]], dict[str, float]]] = [("rank", {}, {})]
        if host_of.nunique() > 1:
            by.append(("node", {}, {}))
        for r, lead in waited:
            by[0][1].setdefault(str(r), []).append(lead)
            if len(by) > 1:
                by[1][1].setdefault(str(host_of[r]), []).append(lead)
        for r in host_of.index:
            by[0][2][str(r)] = 1.0 / n_ranks
            if len(by) > 1:
                by[1][2][str(host_of[r])] = float((host_of == host_of[r]).sum()) / n_ranks
        for kind, counts, shares in by:
            for who, leads in counts.items():
                p0 = shares[who]
                p = binomial_sf(len(leads), total, p0)
                if p < alpha and len(leads) / total > p0:
                    out.append(
                        {
                            "kind": kind, "who": who, "group": group, "points": len(leads), "of": total,
                            "share": len(leads) / total, "expected_share": p0, "p_value": p,
                            "lead_us": float(pd.Series(leads).median()),
                        }
                    )  # fmt: skip
    return out


def describe(s: dict[str, Any]) -> str:
    """One sentence for the console and the report."""
    who = f"rank {s['who']}" if s["kind"] == "rank" else f"node {s['who']}"
    return (
        f"{who} is the one the others wait for in {s['points']} of {s['of']} points of the {s['group']} group "
        f"({s['share']:.0%}, chance {s['expected_share']:.0%}, binomial p = {s['p_value']:.1e}); they wait for it "
        f"a median {s['lead_us']:.0f} µs longer"
    )
