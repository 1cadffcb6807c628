"""Pricing validated on published nccl-tests logs of real clusters (issue 25, item 7).

    python benchmarks/bench_plan_validation.py

For each log under ``tests/data/clusters/`` (sources: ``tests/data/clusters/SOURCES.md``), imported as a user
would (``commbench import nccl-tests``), the cost model is fitted on every other size of the log (the even powers
of two from its smallest size) and asked for the sizes left out, and for the per-call sum of one training step's
collectives at 7B and 70B parameters. Each figure is printed against the log itself:

* held-out sizes: the log's time (mean of its out-of-place and in-place columns) against the price from the
  points kept (``source == "measured"``: the line between the two neighbouring kept sizes) and against the
  latency-bandwidth fit alone (the same model with its points dropped), with whether the log lies inside the
  price's 95 % interval; and the same kept points joined in log-log instead (the choice
  :mod:`commbench.planning.interpolate` made, checked);
* a step: ``sum over calls`` of each call's price, against the same sum read off the whole log (every row kept;
  between two rows the line through them, which the sum needs for call sizes the log does not list; the
  "bucket 64M" rows call only sizes the log lists and the fit left out, so their reference is the log's rows
  alone and their price comes from the kept 32M and 128M rows).

Call sizes (fp32 everywhere: both logs are ``float``): DDP's default buckets (``default_bucket_numels``: 1 MiB,
then 25 MiB, as torch's DDP) and the same with ``bucket_cap_mb=64``, one all_reduce each over all ranks; FSDP's
all_gathers of one unit per transformer layer plus the root unit (embeddings, output layer, final norm), each
gathered twice per step (forward, and again in backward after resharding). Parameter counts per unit from the
published configurations (Hugging Face ``config.json``): llama2-7b (meta-llama/Llama-2-7b-hf: 32 layers, hidden
4096, ffn 11008, 32 heads, vocab 32000; 6 738 415 616 parameters) and llama3-70b (meta-llama/Meta-Llama-3-70B: 80
layers, hidden 8192, ffn 28672, 64 heads, 8 kv heads, vocab 128256; 70 553 706 496 parameters). What a log does
not measure (FSDP's reduce_scatter, a bf16 all_reduce) is named with the command that measures it.

Figures: benchmarks/results/2026-12-02_2core-vm_gloo.md (section "Issue 25: pricing on published logs").
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's commbench, installed or not

import numpy as np  # noqa: E402

from commbench.planning.costmodel import CostModel  # noqa: E402
from commbench.planning.fitting import fit  # noqa: E402
from commbench.store.nccl_import import import_nccl_tests  # noqa: E402
from commbench.store.results import load  # noqa: E402
from commbench.training.strategies import default_bucket_numels  # noqa: E402

CLUSTERS = Path(__file__).resolve().parents[1] / "tests" / "data" / "clusters"
LOGS = {
    # file: (collective, what the step sums, nodes, gpus per node)
    "gcp_a3mega_2x8_h100_all_reduce.txt": ("all_reduce", "ddp", 2, 8),
    "gcp_a4xmax_2x4_gb300_all_gather.txt": ("all_gather", "fsdp", 2, 4),
}


def llama_units(layers: int, h: int, ffn: int, heads: int, kv_heads: int, vocab: int) -> tuple[int, int, int]:
    """(parameters of one decoder layer, of the root unit, in all) of a Llama model: attention q/o h*h each and
    k/v h*h*kv/heads each, SwiGLU 3*h*ffn, two RMSNorms; root = input embedding + untied output layer + final
    norm."""
    layer = 2 * h * h + 2 * h * (h * kv_heads // heads) + 3 * h * ffn + 2 * h
    root = 2 * vocab * h + h
    return layer, root, layers * layer + root


MODELS = {
    "llama2-7b": (32, *llama_units(32, 4096, 11008, 32, 32, 32000)[:2]),
    "llama3-70b": (80, *llama_units(80, 8192, 28672, 64, 8, 128256)[:2]),
}


def ddp_calls(psi: int, cap_bytes: int | None) -> Counter[float]:
    """Wire bytes -> calls: DDP's buckets of fp32 gradients (default: 1 MiB then 25 MiB; else all ``cap_bytes``)."""
    if cap_bytes is None:
        return Counter(float(4 * b) for b in default_bucket_numels(psi))
    full, rest = divmod(4 * psi, cap_bytes)
    return Counter({float(cap_bytes): full, **({float(rest): 1} if rest else {})})


def fsdp_gathers(layers: int, layer: int, root: int) -> Counter[float]:
    """Wire bytes (all_gather's total output) -> calls: every unit gathered in forward and again in backward."""
    return Counter({float(4 * layer): 2 * layers, float(4 * root): 2})


def price(model: CostModel, coll: str, calls: Counter[float], n: int, nodes: int) -> tuple[float, float, float, str]:
    """Per-call sum (s) with the summed 95 % bounds (fully correlated) and how the calls were priced."""
    t = lo = hi = 0.0
    how: Counter[str] = Counter()
    for size, k in calls.items():
        p = model.predict(coll, "fp32", world_size=n, nbytes=size, nodes=nodes)
        t, lo, hi = t + k * p.time_s, lo + k * p.low_s, hi + k * p.high_s
        how[p.source] += k
    return t, lo, hi, ", ".join(f"{k} {s}" for s, k in sorted(how.items()))


def human(b: float) -> str:
    for unit, s in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if b >= s:
            return f"{b / s:.4g}{unit}"
    return f"{b:g}"


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="plan-validation-"))
    summary = []
    for name, (coll, strategy, nodes, gpn) in LOGS.items():
        run = import_nccl_tests(CLUSTERS / name, tmp / name.removesuffix(".txt"))
        df = load(run)
        n = int(df["world_size"].iloc[0])
        sizes = sorted(df["size_bytes"].unique())
        kept, held = sizes[::2], sizes[1::2]
        full = fit(df)  # every row: the reference curve
        sub = fit(df[df["size_bytes"].isin(kept)])
        sub_fit = dataclasses.replace(sub, measured={})  # the same model, its points dropped: the line alone
        full_fit = dataclasses.replace(full, measured={})
        f = sub.get(coll, "fp32")
        print(f"\n## {name}: {coll} fp32, n={n} on {nodes} nodes; fit on {len(kept)} sizes "
              f"({human(kept[0])}..{human(kept[-1])}), {len(held)} held out")  # fmt: skip
        print(f"# alpha-beta fit of the kept sizes: alpha {f.alpha_s * 1e6:.2f} us/step, busbw {f.busbw_gbps:.1f} "
              f"GB/s, worst residual {f.worst_rel_residual:+.0%} at {f.worst_where}")  # fmt: skip
        print(f"{'size':>8} {'log_us':>10} {'points_us':>10} {'ratio':>6} {'95% interval':>21} {'in':>3} "
              f"{'fit_us':>10} {'ratio':>6}")  # fmt: skip
        e_pts, e_fit, inside = [], [], 0
        for s in held:
            if not kept[0] <= s <= kept[-1]:
                continue
            truth = float(df.loc[df["size_bytes"] == s, "time_us"].mean()) * 1e-6
            p = sub.predict(coll, "fp32", world_size=n, nbytes=s, nodes=nodes)
            q = sub_fit.predict(coll, "fp32", world_size=n, nbytes=s, nodes=nodes)
            assert p.source == "measured" and q.source == "fitted"
            ok = p.low_s <= truth <= p.high_s
            inside += ok
            e_pts.append(p.time_s / truth - 1)
            e_fit.append(q.time_s / truth - 1)
            print(f"{human(s):>8} {truth * 1e6:10.1f} {p.time_s * 1e6:10.1f} {p.time_s / truth:6.3f} "
                  f"{p.low_s * 1e6:10.1f}..{p.high_s * 1e6:9.1f} {'yes' if ok else 'no':>3} {q.time_s * 1e6:10.1f} "
                  f"{q.time_s / truth:6.3f}")  # fmt: skip
        a_pts, a_fit = np.abs(e_pts), np.abs(e_fit)
        line = (f"{name}: held-out {len(e_pts)} sizes: points median |err| {np.median(a_pts):.1%} (max "
                f"{a_pts.max():.1%}), inside the interval {inside}/{len(e_pts)}; alpha-beta fit median |err| "
                f"{np.median(a_fit):.1%} (max {a_fit.max():.1%})")  # fmt: skip
        print("# " + line)
        summary.append(line)
        # the design choice checked: the same kept points joined in log-log instead of by the line through them
        means = df.groupby("size_bytes")["time_us"].mean()
        ks = np.array(kept, float)
        hs = np.array([s for s in held if kept[0] <= s <= kept[-1]], float)
        kt, ht = means.loc[ks].to_numpy(float), means.loc[hs].to_numpy(float)
        e_ll = np.abs(np.exp(np.interp(np.log(hs), np.log(ks), np.log(kt))) / ht - 1)
        e_lin = np.abs(np.interp(hs, ks, kt) / ht - 1)
        line = (f"{name}: held-out, kept points joined linearly: median |err| {np.median(e_lin):.1%}, mean "
                f"{e_lin.mean():.1%}, max {e_lin.max():.1%}; in log-log: {np.median(e_ll):.1%}, {e_ll.mean():.1%}, "
                f"{e_ll.max():.1%}")  # fmt: skip
        print("# " + line)
        summary.append(line)

        print(f"\n# one {strategy.upper()} step, fp32, per-call sum against the log (sum of the log's own times "
              "at the same calls)")  # fmt: skip
        print(f"{'model':>11} {'calls':>18} {'log_ms':>9} {'points_ms':>10} {'ratio':>6} {'95% interval':>19} "
              f"{'in':>3} {'fit_ms':>9} {'ratio':>6} {'fit(all)':>9} {'ratio':>6}  priced")  # fmt: skip
        for model_name, (layers, layer, root) in MODELS.items():
            psi = layers * layer + root
            if strategy == "ddp":
                variants = {"bucket 25M": ddp_calls(psi, None), "bucket 64M": ddp_calls(psi, 64 * 2**20)}
            else:
                variants = {"unit/layer": fsdp_gathers(layers, layer, root)}
            for label, calls in variants.items():
                ref = price(full, coll, calls, n, nodes)[0]
                t, lo, hi, how = price(sub, coll, calls, n, nodes)
                tf = price(sub_fit, coll, calls, n, nodes)[0]
                ta = price(full_fit, coll, calls, n, nodes)[0]
                ok = lo <= ref <= hi
                ncalls = sum(calls.values())
                print(f"{model_name:>11} {f'{ncalls} ({label})':>18} {ref * 1e3:9.2f} {t * 1e3:10.2f} {t / ref:6.3f} "
                      f"{lo * 1e3:9.2f}..{hi * 1e3:8.2f} {'yes' if ok else 'no':>3} {tf * 1e3:9.2f} {tf / ref:6.3f} "
                      f"{ta * 1e3:9.2f} {ta / ref:6.3f}  {how}")  # fmt: skip
                summary.append(
                    f"{name}: {model_name} {strategy} {label}: log {ref * 1e3:.2f} ms, points {t / ref:.3f}x "
                    f"({'inside' if ok else 'outside'} {lo * 1e3:.2f}..{hi * 1e3:.2f}), fit {tf / ref:.3f}x, "
                    f"fit of every row {ta / ref:.3f}x"
                )
        if strategy == "fsdp":
            layers, layer, _ = MODELS["llama2-7b"]
            print("# " + full.missing_measurement("reduce_scatter", "fp32", nodes=nodes, gpus_per_node=gpn,
                                                  fp32_bytes=4.0 * layer))  # fmt: skip
        else:
            print("# " + full.missing_measurement("all_reduce", "bf16", nodes=nodes, gpus_per_node=gpn,
                                                  fp32_bytes=25.0 * 2**20))  # fmt: skip
        # another layout (4x the nodes, same ranks per node): no log of it to compare, so the price is shown, not
        # checked: the log's points scaled by the ring formula, against the fit alone
        layers, layer, root = MODELS["llama2-7b"]
        calls = ddp_calls(layers * layer + root, None) if strategy == "ddp" else fsdp_gathers(layers, layer, root)
        t, lo, hi, how = price(full, coll, calls, n * 4, nodes * 4)
        tf = price(full_fit, coll, calls, n * 4, nodes * 4)[0]
        line = (f"{name}: llama2-7b {strategy} step on n={n * 4} ({nodes * 4} nodes), not in the log: {t * 1e3:.2f} ms "
                f"({lo * 1e3:.2f}..{hi * 1e3:.2f}; {how}); the fit alone {tf * 1e3:.2f} ms; on the log's n={n}: "
                f"{price(full, coll, calls, n, nodes)[0] * 1e3:.2f} ms")  # fmt: skip
        print("# " + line)
        summary.append(line)
        big = full.predict(coll, "fp32", world_size=n * 4, nbytes=kept[-1] * 2, nodes=nodes * 4)
        print(f"# beyond the log (n={n * 4} on {nodes * 4} nodes, {human(kept[-1] * 2)}): {big.source}, "
              f"extrapolated={big.extrapolated}; warnings: " + " | ".join(big.warnings))  # fmt: skip
    print("\n# summary")
    for line in summary:
        print("# " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
