"""The low-precision gain of each parallelism against its own full-precision reference (issue 24 item 4).

References are independent of the view: step-time samples made up here, their median and 95 % interval read off
the sorted samples with the published order-statistic ranks (n = 10: the 2nd and 9th; Hollander & Wolfe, table
of the sign test), the unpaired ratio's interval written out as the delta method in log space, and the byte
ratios from the counts chosen here (or, end to end, from Megatron-LM's formula for TP and the cast hook's halving
for DP).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from commbench.views.findings import findings
from commbench.views.rundata import RunData
from commbench.views.training_tables import (
    CPU_TIMING_NOTE,
    gain_by_parallelism,
    gain_by_parallelism_lines,
    training_parallelism_table,
)
from tests.cli_util import commbench

REPO = Path(__file__).resolve().parents[1]
Z = 1.959963984540054  # two-sided 95 % standard-normal quantile
WARMUP, MEASURED = 2, 10


def _median_ci(times: list[float]) -> tuple[float, float, float]:
    """n = 10: median of the middle two, interval from the 2nd to the 9th order statistic (coverage 0.979)."""
    s = sorted(times)
    assert len(s) == 10
    return (s[4] + s[5]) / 2, s[1], s[8]


def _speedup(ref: list[float], pol: list[float]) -> tuple[float, float, float]:
    """ref median / pol median with the delta-method interval: log-space standard errors from each 95 % interval,
    added in quadrature."""
    (mr, lr, hr), (mp, lp, hp) = _median_ci(ref), _median_ci(pol)
    se = math.hypot(math.log(hr / lr) / (2 * Z), math.log(hp / lp) / (2 * Z))
    r = mr / mp
    return r, r * math.exp(-Z * se), r * math.exp(Z * se)


# Step times (microseconds), 10 measured steps each; bytes per measured step.
TIMES: dict[str, list[float]] = {
    "fp32": [100_000 + 700 * k for k in (3, 1, 4, 1, 5, 9, 2, 6, 5, 3)],
    "tp_fp32": [200_000 + 900 * k for k in (2, 7, 1, 8, 2, 8, 1, 8, 2, 8)],
    "tp_bf16": [150_000 + 800 * k for k in (1, 4, 1, 4, 2, 1, 3, 5, 6, 2)],  # clearly faster than tp_fp32
    "amp_bf16": [100_000 + 700 * k for k in (2, 7, 1, 8, 2, 8, 1, 8, 2, 8)],  # overlaps fp32: not significant
    "bf16_hook": [130_000 + 500 * k for k in (5, 3, 5, 8, 9, 7, 9, 3, 2, 3)],  # clearly slower than fp32
    "hsdp_bf16": [120_000 + 100 * k for k in range(10)],  # its reference hsdp_fp32 did not run
}
BYTES: dict[str, list[float]] = {
    "fp32": [1000.0] * 10,
    "tp_fp32": [4000.0] * 10,
    "tp_bf16": [3000.0] * 10,
    "amp_bf16": [1000.0] * 10,
    "bf16_hook": [500.0, 520.0] * 5,  # a count that differs between steps: a range
    "hsdp_bf16": [800.0] * 10,
}
# (parallelism, reference) as the runner writes them; None = a row from before the columns existed.
LAYOUT: dict[str, tuple[Any, Any]] = {
    "fp32": ("dp", None),
    "tp_fp32": ("tp", None),
    "tp_bf16": ("tp", "tp_fp32"),
    "amp_bf16": (None, "fp32"),  # no parallelism written: data parallel
    "bf16_hook": ("dp", "fp32"),
    "hsdp_bf16": ("dp", "hsdp_fp32"),
}
FINAL_LOSS = {"fp32": 2.0, "tp_fp32": 2.0001, "tp_bf16": 2.003, "amp_bf16": 2.01, "bf16_hook": 2.002, "hsdp_bf16": 2.1}


def _frames(device: str = "cpu") -> tuple[pd.DataFrame, pd.DataFrame]:
    summary, steps = [], []
    for pol, times in TIMES.items():
        med, lo, hi = _median_ci(times)
        par, ref = LAYOUT[pol]
        summary.append(
            dict(policy=pol, family="x", parallelism=par, reference_policy=ref, comm_dtype="", model="gpt",
                 world_size=2, backend="gloo", device=device, steps=MEASURED, step_time_us_p50=med,
                 step_time_us_ci_low=lo, step_time_us_ci_high=hi, comm_bytes_per_step=sum(BYTES[pol]) / MEASURED,
                 final_loss=FINAL_LOSS[pol], error=None)
        )  # fmt: skip
        for s in range(WARMUP + MEASURED):
            warm = s < WARMUP
            steps.append(
                dict(policy=pol, step=s, warmup=warm, step_time_us=5e6 if warm else times[s - WARMUP],
                     comm_bytes=1e9 if warm else BYTES[pol][s - WARMUP])
            )  # fmt: skip
    return pd.DataFrame(summary), pd.DataFrame(steps)


def _ci_text(v: tuple[float, float, float]) -> str:
    return f"{v[0]:.2f}× [{v[1]:.2f}–{v[2]:.2f}]"


def test_gain_by_parallelism_against_formulas() -> None:
    summary, steps = _frames()
    g = gain_by_parallelism(summary, steps).set_index("policy")
    # grouped by parallelism in the order met (tp_bf16 is the first low-precision row), one row per low-precision
    # policy; references are not rows
    assert list(g.index) == ["tp_bf16", "amp_bf16", "bf16_hook", "hsdp_bf16"]
    assert list(g["parallelism"]) == ["tp", "dp", "dp", "dp"]
    for pol, ref, word in (("tp_bf16", "tp_fp32", "faster"), ("amp_bf16", "fp32", "no significant difference"),
                           ("bf16_hook", "fp32", "slower")):  # fmt: skip
        want = _speedup(TIMES[ref], TIMES[pol])
        got = g.loc[pol]
        assert got["reference_policy"] == ref
        assert (got["speedup"], got["speedup_ci_low"], got["speedup_ci_high"]) == pytest.approx(want, rel=1e-12)
        assert got["verdict"] == word
        assert got["final_loss_drift"] == pytest.approx(FINAL_LOSS[pol] - FINAL_LOSS[ref], abs=1e-12)
    assert _speedup(TIMES["fp32"], TIMES["amp_bf16"])[1] < 1 < _speedup(TIMES["fp32"], TIMES["amp_bf16"])[2]
    tp = g.loc["tp_bf16"]
    assert (tp["comm_bytes_ratio"], tp["comm_ratio_low"], tp["comm_ratio_high"], tp["comm_saved"]) == pytest.approx(
        (0.75, 0.75, 0.75, 0.25)
    )
    hook = g.loc["bf16_hook"]  # 510 mean against 1000; steps from 500/1000 to 520/1000 (warm-up steps left out)
    assert (hook["comm_bytes_ratio"], hook["comm_ratio_low"], hook["comm_ratio_high"]) == pytest.approx(
        (0.51, 0.50, 0.52)
    )
    assert g.loc["amp_bf16", "comm_saved"] == 0.0
    missing = g.loc["hsdp_bf16"]
    assert (
        missing["note"] == "reference not in this run" and math.isnan(missing["speedup"]) and missing["verdict"] == ""
    )
    # without the steps file the byte ratio stands alone (no range)
    alone = gain_by_parallelism(summary).set_index("policy").loc["bf16_hook"]
    assert alone["comm_bytes_ratio"] == pytest.approx(0.51) and math.isnan(alone["comm_ratio_low"])
    # a skipped reference: the row says so instead of a number
    err = summary.assign(error=[("boom" if p == "tp_fp32" else None) for p in summary["policy"]])
    assert gain_by_parallelism(err).set_index("policy").loc["tp_bf16", "note"] == "reference skipped"
    both = err.assign(error=[("boom" if p.startswith("tp_") else None) for p in err["policy"]])
    assert gain_by_parallelism(both).set_index("policy").loc["tp_bf16", "note"] == "both skipped"
    # runs from before the columns existed: no comparison, no error
    assert gain_by_parallelism(summary.drop(columns=["reference_policy", "parallelism"])).empty


def test_table_console_and_finding_say_the_same() -> None:
    summary, steps = _frames()
    tp, dp_same, dp_slow = (
        _speedup(TIMES["tp_fp32"], TIMES["tp_bf16"]),
        _speedup(TIMES["fp32"], TIMES["amp_bf16"]),
        _speedup(TIMES["fp32"], TIMES["bf16_hook"]),
    )
    table = training_parallelism_table(summary, steps)
    assert table is not None
    rows = {r[1]: r for r in table.rows}
    assert rows["tp_bf16"] == ["TP", "tp_bf16", "tp_fp32", _ci_text(tp), "faster", "3.91 KiB", "2.93 KiB", "-25 %",
                               "0.0029"]  # fmt: skip
    assert rows["amp_bf16"][3:5] == [_ci_text(dp_same), "no significant difference"]
    assert rows["bf16_hook"][4] == "slower" and rows["bf16_hook"][7] == "-49 % [-50–-48]"
    assert rows["hsdp_bf16"][2] == "hsdp_fp32 (reference not in this run)" and rows["hsdp_bf16"][3] == ""
    assert CPU_TIMING_NOTE in table.note and "gpt, 2 ranks" in table.note

    lines = gain_by_parallelism_lines(summary, steps)
    assert lines[-1] == CPU_TIMING_NOTE and len(lines) == 1 + 3 + 1
    assert not any("hsdp_bf16" in ln for ln in lines)  # its reference is not in the run: no "n/a" line (issue 33)
    tp_line = next(ln for ln in lines if "tp_bf16" in ln)
    assert re.search(
        rf"TP +tp_bf16 +vs tp_fp32 +{re.escape(_ci_text(tp))} faster 3\.91 KiB -> 2\.93 KiB \(-25 %\)", tp_line
    )

    run = RunData(Path("."), pd.DataFrame(), {}, training=summary, training_steps=steps)
    said = [f for f in findings(run) if "by parallelism" in f]
    assert len(said) == 1
    assert f"TP: tp_bf16 saves 25% of tp_fp32's bytes per step and is {_ci_text(tp)} faster. DP: " in said[0]
    assert "DP: amp_bf16 sends as many bytes per step as fp32, with no significant step-time difference; " in said[0]
    assert f"bf16_hook saves 49% of fp32's bytes per step but is slower ({_ci_text(dp_slow)})" in said[0]
    assert "hsdp_bf16" not in said[0]  # no reference, nothing to state
    assert said[0].endswith(CPU_TIMING_NOTE)
    assert dp_same[1] < 1 < dp_same[2] and dp_slow[2] < 1 < tp[1]

    # on GPUs the note goes; a data-parallel run against fp32 alone adds no sentence (the fp32 findings say it)
    gpu, gpu_steps = _frames(device="cuda:0")
    table = training_parallelism_table(gpu, gpu_steps)
    assert table is not None and CPU_TIMING_NOTE not in table.note
    assert CPU_TIMING_NOTE not in gain_by_parallelism_lines(gpu, gpu_steps)
    dp = summary[summary["policy"].isin(["fp32", "amp_bf16", "bf16_hook"])]
    assert not [f for f in findings(RunData(Path("."), pd.DataFrame(), {}, training=dp)) if "by parallelism" in f]


def test_every_reference_is_a_full_precision_policy_of_the_same_parallelism() -> None:
    from commbench.core import plugins
    from commbench.training.policies import BASELINE, get_policy, list_policies
    from commbench.training.runner import reference_of

    plugins.load()
    lossless = {
        name
        for name in list_policies()
        if not (get_policy(name).underflow.absolute or get_policy(name).underflow.relative)
    }
    assert {"fp32", "tp_fp32", "hsdp_fp32", "zero1_fp32"} <= lossless and "amp_bf16" not in lossless
    for name in list_policies():
        p = get_policy(name)
        ref = reference_of(p)
        if name in lossless:
            assert ref == "" and p.reference is None, name
            continue
        assert ref in lossless, name  # a low-precision policy always has one
        if p.reference is None:
            # no twin (FSDP2): the fp32 DDP baseline, which only a data-parallel policy may fall back to
            assert ref == BASELINE and p.sharding.parallelism == "dp", name
        else:
            assert get_policy(ref).sharding.parallelism == p.sharding.parallelism, name
    assert {n: reference_of(get_policy(n)) for n in ("tp_bf16", "hsdp_bf16", "zero2_bf16", "fsdp1_bf16", "fp8_hook",
                                                      "fsdp2_bf16")} == {
        "tp_bf16": "tp_fp32", "hsdp_bf16": "hsdp_fp32", "zero2_bf16": "zero2_fp32", "fsdp1_bf16": "zero3_fp32",
        "fp8_hook": "fp32", "fsdp2_bf16": "fp32",
    }  # fmt: skip


SUITE = """
name = "training_gain"
collectives = ["all_reduce"]
precisions = ["fp32"]
min_bytes = "4K"
max_bytes = "4K"

[training]
model = "gpt"
policies = ["fp32", "bf16_hook", "tp_fp32", "tp_bf16"]
steps = 6
warmup_steps = 1
batch_size = 2
seq_len = 16
d_model = 32
n_layers = 2
n_heads = 4
vocab = 64
comm_timed_steps = 0
"""


@pytest.mark.timeout(300)
def test_run_then_report_shows_the_comparison(tmp_path: Path) -> None:
    suite = tmp_path / "gain.toml"
    suite.write_text(SUITE)
    out = tmp_path / "run"
    fast = ["--min-time", "0.002", "--min-iters", "1", "--repeats", "3", "--warmup", "1", "--no-report"]
    r = commbench("run", str(suite), "--nproc", "2", "--out", str(out), *fast, cwd=REPO, timeout=280,
                  env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    t = pd.read_csv(out / "training.csv").set_index("policy")
    assert t.loc["tp_bf16", "parallelism"] == "tp" and t.loc["tp_bf16", "reference_policy"] == "tp_fp32"
    assert t.loc["bf16_hook", "parallelism"] == "dp" and t.loc["bf16_hook", "reference_policy"] == "fp32"
    assert pd.isna(t.loc["tp_fp32", "reference_policy"]) and t.loc["tp_fp32", "parallelism"] == "tp"

    steps = pd.read_csv(out / "training_steps.csv")

    def speed(ref: str, pol: str) -> str:
        """The paired rounds (issue 35): one round per step, the reference's time over the policy's per round,
        their median (6 rounds: the geometric mean of the 3rd and 4th) and the 1st and 6th order statistics."""
        assert t.loc[pol, "reference_policy"] == ref and t.loc[pol, "speedup_ref_basis"] == "paired rounds"
        own = steps[(steps["policy"] == pol) & ~steps["warmup"]]["step_time_us"].tolist()
        s = sorted(r / o for r, o in zip(json.loads(t.loc[pol, "speedup_ref_times_us"]), own, strict=True))
        assert len(s) == 6
        return _ci_text((math.sqrt(s[2] * s[3]), s[0], s[5]))

    # TP bytes: Megatron's 4 all-reduces of b*s*h per layer, 2 of them bf16 under autocast: 1 - (2*2 + 2*4)/(4*4);
    # DP: the bf16 hook halves the gradient all-reduce
    console = r.stdout
    assert "low-precision gain by parallelism" in console
    assert re.search(rf"# +TP +tp_bf16 +vs tp_fp32 +{re.escape(speed('tp_fp32', 'tp_bf16'))} .*\(-25 %\)", console)
    assert re.search(rf"# +DP +bf16_hook +vs fp32 +{re.escape(speed('fp32', 'bf16_hook'))} .*\(-50 %\)", console)
    assert "do not transfer to NCCL over NVLink" in console

    rep = commbench("report", str(out), cwd=REPO, timeout=200)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    md = (out / "report.md").read_text()
    assert "Training: low-precision gain by parallelism" in md
    assert f"| TP | tp_bf16 | tp_fp32 | {speed('tp_fp32', 'tp_bf16')} |" in md
    assert f"| DP | bf16_hook | fp32 | {speed('fp32', 'bf16_hook')} |" in md
    assert "Training, low-precision gain by parallelism" in md and "saves 25% of tp_fp32's bytes per step" in md
    assert "do not transfer to NCCL over NVLink" in md
