"""The ``example_wire_ratio`` report figure: bytes on the wire per fp32 byte of the user's tensor, per precision.

Drawn from the run's results table only (views read results, they never re-run anything); ``None`` when the
run has no sweep rows, so the report then leaves it out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import pandas as pd

from commbench.views.plots import FIGURES

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from commbench.views.rundata import RunData

NAME = "example_wire_ratio"
CAPTION = "Bytes on the wire per fp32 byte of the user's tensor, by precision (example plugin): below 1 compresses."


@FIGURES.register(NAME, CAPTION)
def wire_ratio(run: RunData) -> Figure | None:
    df = run.results
    if df.empty or not {"precision", "wire_bytes", "fp32_bytes"} <= set(df.columns):
        return None
    ratio = (pd.to_numeric(df["wire_bytes"]) / pd.to_numeric(df["fp32_bytes"])).groupby(df["precision"]).median()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(range(len(ratio)), ratio.to_numpy())
    ax.set_xticks(range(len(ratio)), [str(p) for p in ratio.index], rotation=30, ha="right")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("wire bytes / fp32 bytes (median)")
    ax.set_title("Wire bytes per fp32 byte")
    fig.tight_layout()
    return fig
