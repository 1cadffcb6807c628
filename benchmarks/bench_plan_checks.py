"""The capacity plan checked against measurements, in one run: predicted / measured ratios.

(a) memory: the planned model state and total per rank for the training suite's model against the training
    run's analytic model-state bytes and its measured peak memory;
(b) bytes: planned comm bytes per step against the bytes the training run counted, for every policy;
(c) an imported nccl-tests log of an 8-GPU node: the plan's gradient all_reduce time for a model against that
    log's own busbw arithmetic (time = size * 2(n-1)/n / busbw, interpolated between its rows);
(d) time: the plan's communication time per step (cost models fitted to a stream sweep and to an isolated-mode sweep
    on this machine: `--timing-mode isolated` times one op after compute, as a step issues it) against the
    training run's measured `comm_time_us`: extra steps with every collective synchronous, per call the
    minimum duration over ranks, summed per step, median over the steps (commbench.training.comm). Both are
    wire time with no overlap: the plan's `comm_time_s - codec_time_s` (its encode/decode is printed apart;
    the measured figure excludes the hooks' codec work). Target: within 25 %.

    PYTHONPATH=$PWD python benchmarks/bench_plan_checks.py [--train RUN --sweep RUN --d-train RUN --d-sweep RUN]
        [--work DIR]

Runs it does not get, it makes (a few minutes on 2 CPU cores): `commbench run suites/training.toml` on 2 ranks,
a sweep of all_reduce/all_gather/reduce_scatter in fp32/bf16/fp16/fp8_e4m3 on 2 ranks, the same sweep with
`--timing-mode isolated`, and for (d) a run of six policies on 2 ranks with 40 timed comm steps each (a step's comm time spreads over 2-3x between steps on this machine).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's commbench, installed or not

import pandas as pd  # noqa: E402

from commbench.planning import fitting
from commbench.planning.options import TORCH_ADAMW
from commbench.planning.plan import plan, plan_policies
from commbench.store.results import load_metadata
from commbench.training.policies import get_policy

ROOT = Path(__file__).resolve().parents[1]
NCCL_8GPU = ROOT / "tests" / "data" / "nccl_multi.txt"


def run(*args: str, env: dict[str, str] | None = None) -> None:
    print(" ".join(f"{k}={v}" for k, v in (env or {}).items()) + " python -m commbench " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "commbench", *args], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, stdout=subprocess.DEVNULL)  # fmt: skip


D_POLICIES = ["fp32", "bf16_hook", "fp8_hook", "fsdp2_bf16", "zero2_fp32", "zero3_bf16"]
D_SUITE = """name = "plan_check_d"
[training]
model = "gpt"
policies = {policies}
steps = 5
warmup_steps = 2
comm_timed_steps = {timed}
batch_size = 8
seq_len = 64
d_model = 128
n_layers = 4
n_heads = 4
vocab = 512
measure_memory = false
"""


D_TIMED = 40


def ensure_d(work: Path) -> Path:
    """(d)'s run: six policies on 2 ranks, `D_TIMED` timed comm steps each."""
    suite = work / "plan_check_d.toml"
    suite.parent.mkdir(parents=True, exist_ok=True)
    suite.write_text(D_SUITE.format(policies=json.dumps(D_POLICIES), timed=D_TIMED))
    d2 = work / "d_train2"
    if not (d2 / "training.csv").exists():
        run("run", str(suite), "--no-report", "--quiet", "--nproc", "2", "--out", str(d2))
    return d2


def ensure_isolated(work: Path) -> Path:
    """(d)'s second sweep: the same grid timed as a training step issues collectives (`--timing-mode isolated`)."""
    sweep = work / "sweep2_isolated"
    if not (sweep / "results.csv").exists():
        run("run", "--collectives", "all_reduce,all_gather,reduce_scatter", "--precisions", "fp32,bf16,fp16,fp8_e4m3",
            "-b", "16K", "-e", "16M", "-f", "4", "--timing-mode", "isolated", "--no-training", "--no-report", "--quiet",
            "--nproc", "2", "--out", str(sweep))  # fmt: skip
    return sweep


def ensure(work: Path, train: Path | None, sweep: Path | None) -> tuple[Path, Path]:
    train = train or work / "train2"
    sweep = sweep or work / "sweep2"
    if not (train / "training.csv").exists():
        run("run", "suites/training.toml", "--no-report", "--quiet", "--nproc", "2", "--out", str(train))
    if not (sweep / "results.csv").exists():
        run("run", "--collectives", "all_reduce,all_gather,reduce_scatter", "--precisions", "fp32,bf16,fp16,fp8_e4m3",
            "-b", "16K", "-e", "16M", "-f", "4", "--no-training", "--no-report", "--quiet", "--nproc", "2",
            "--out", str(sweep))  # fmt: skip
    return train, sweep


def plan_shape(t: pd.DataFrame, cfg: dict) -> dict:
    """The plan's model shape for a training run on one node: its Psi, ranks and [training] section."""
    # commbench's GPT (training/nets.py): LayerNorm, a 4h GeLU MLP, biases, an untied head
    return dict(params=float(t["params"].iloc[0]), nodes=1, gpus_per_node=int(t["world_size"].iloc[0]),
                layers=int(cfg["n_layers"]), hidden=int(cfg["d_model"]), heads=int(cfg["n_heads"]),
                ffn=4 * int(cfg["d_model"]), vocab=int(cfg["vocab"]), seq=int(cfg["seq_len"]),
                micro_batch=int(cfg["batch_size"]), gated_mlp=False, norm_params=2, biases=True,
                tied_embeddings=False)  # fmt: skip


def ratio(a: float, b: float) -> float:
    return a / b if b and not (math.isnan(a) or math.isnan(b)) else math.nan


def fmt(v: float, spec: str = ".3f") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=Path, help="training run on N >= 2 ranks (default: made under --work)")
    ap.add_argument("--sweep", type=Path, help="sweep on N ranks to fit the cost model")
    ap.add_argument("--d-train", type=Path, help="(d): training run on N ranks with comm_time_us (comm_timed_steps > 0)")
    ap.add_argument("--d-sweep", type=Path, help="(d): sweep timed with --timing-mode isolated (default: made under --work)")
    ap.add_argument("--work", type=Path, default=Path("results/bench_plan"), help="where missing runs go")
    a = ap.parse_args()
    train, sweep = ensure(a.work, a.train, a.sweep)

    t = pd.read_csv(train / "training.csv")

    meta = load_metadata(train)
    cfg = meta["suite"]["training"]
    n = int(t["world_size"].iloc[0])
    psi = float(t["params"].iloc[0])
    policies = [get_policy(p) for p in t["policy"]]
    model = fitting.fit([sweep])
    shape = plan_shape(t, cfg)
    pl = plan_policies(policies, parts=TORCH_ADAMW, model=model, **shape).set_index("strategy")
    pl_psi = plan_policies(policies, params=psi, nodes=1, gpus_per_node=n).set_index("strategy")  # Psi only
    print(f"# host {meta.get('host')}, {meta.get('backend')}, {n} ranks; model {cfg['model']} Psi={psi:.0f} "
          f"(d_model {cfg['d_model']}, {cfg['n_layers']} layers, seq {cfg['seq_len']}, batch {cfg['batch_size']})")
    print(f"# runs: train {train}, sweep {sweep}")

    print("\n(a) memory per rank: planned / training run")
    print(f"{'policy':<24}{'state/analytic':>15}{'state/peak':>12}{'total/peak':>12}  (peak: measured, {t['peak_mem_kind'].iloc[0]})")
    for _, r in t.iterrows():
        p = pl.loc[r["policy"]]
        print(f"{r['policy']:<24}{fmt(ratio(p['mem_model_state_bytes'], r['model_state_bytes'])):>15}"
              f"{fmt(ratio(p['mem_model_state_bytes'], r['peak_mem_bytes'])):>12}"
              f"{fmt(ratio(p['mem_total_bytes'], r['peak_mem_bytes'])):>12}")  # fmt: skip

    print("\n(b) comm bytes per step: planned / measured (layout from --layers/--hidden; and from Psi alone)")
    print(f"{'policy':<24}{'planned':>12}{'measured':>12}{'ratio':>9}{'Psi-only':>10}")
    for _, r in t.iterrows():
        p, q = pl.loc[r["policy"]], pl_psi.loc[r["policy"]]
        m = float(r["comm_bytes_per_step"])
        print(f"{r['policy']:<24}{p['comm_bytes_per_step']:>12.0f}{m:>12.0f}{fmt(ratio(p['comm_bytes_per_step'], m), '.6f'):>9}"
              f"{fmt(ratio(q['comm_bytes_per_step'], m), '.4f'):>10}")  # fmt: skip

    print(f"\n(c) nccl-tests log of an 8-GPU node ({NCCL_8GPU.name}): plan's DDP gradient all_reduce vs the log's busbw")
    nccl_run = a.work / "nccl8"
    if not (nccl_run / "results.csv").exists():
        run("import", "nccl-tests", str(NCCL_8GPU), "--out", str(nccl_run))
    log = pd.read_csv(nccl_run / "results.csv")
    ar = log[(log["collective"] == "all_reduce") & (log["placement"] == "out-of-place")] if "placement" in log else log[log["collective"] == "all_reduce"]
    ar = ar.groupby("size_bytes", as_index=False).first().sort_values("size_bytes")
    prec = str(ar["precision"].iloc[0])
    nlog = int(ar["world_size"].iloc[0])
    bf = 2 * (nlog - 1) / nlog
    nccl_model = fitting.fit([nccl_run])
    print(f"# {len(ar)} all_reduce sizes {int(ar['size_bytes'].min())}..{int(ar['size_bytes'].max())} B, {prec}, "
          f"{nlog} ranks; the plan's fp8 is the codec hook, priced by this {prec} all_reduce fit")  # fmt: skip

    def log_time(size: float) -> float:
        xs, ts = ar["size_bytes"].to_numpy(float), (ar["size_bytes"] * bf / (ar["busbw_gbps"] * 1e9)).to_numpy(float)
        if size <= xs[0]:
            return float(ts[0])
        for i in range(1, len(xs)):
            if size <= xs[i]:
                return float(ts[i - 1] + (ts[i] - ts[i - 1]) * (size - xs[i - 1]) / (xs[i] - xs[i - 1]))
        return float(ts[-1] * size / xs[-1])  # beyond the log: bandwidth-bound extrapolation

    print(f"{'Psi':>10}{'buckets (wire B)':>28}{'plan_us':>10}{'log_us':>10}{'ratio':>8}  extrapolated")
    for psi_c in (2**18, 2**20, 1.5 * 2**20, 16 * 2**20):
        r = plan(params=psi_c, nodes=1, gpus_per_node=nlog, strategies=["ddp"], precisions=["fp8"], model=nccl_model).iloc[0]
        wire_per_fp32 = nccl_model.get("all_reduce", prec).wire_per_fp32
        from commbench.planning.options import PRECISIONS, bucket_counts

        # the plan's fp8 keeps bf16 gradients: DDP's buckets hold 25 MiB of them
        grad = PRECISIONS["fp8"].grad_bytes
        buckets = [b * 4 * wire_per_fp32 for b, k in bucket_counts(psi_c, grad) for _ in range(k)]
        t_log = sum(log_time(b) for b in buckets)
        shown = ",".join(f"{b:.0f}" for b in buckets[:3]) + ("..." if len(buckets) > 3 else "")
        print(f"{psi_c:>10.0f}{shown:>28}{r['comm_time_s'] * 1e6:>10.2f}{t_log * 1e6:>10.2f}"
              f"{fmt(ratio(r['comm_time_s'], t_log)):>8}  {bool(r['comm_extrapolated'])}")  # fmt: skip

    d2 = a.d_train or ensure_d(a.work)
    t = pd.read_csv(d2 / "training.csv")
    dcfg = load_metadata(d2)["suite"]["training"]
    dshape = plan_shape(t, dcfg)
    iso_sweep = a.d_sweep or ensure_isolated(a.work)
    models = {"stream": model, "isolated": fitting.fit([iso_sweep])}
    print(f"\n(d) comm time per step, wire only, no overlap: plan (comm_time_s - codec_time_s) / measured (comm_time_us:"
          f" {dcfg.get('comm_timed_steps')} timed steps, synchronous collectives, min over ranks per call; {d2}). Two"
          f" cost models: fitted to the stream sweep ({sweep}: back-to-back ops, nccl-tests' loop) and to the isolated"
          f" sweep ({iso_sweep}: one op after 20 ms of compute, as a step issues its collectives); the plan prices"
          f" steps, so the isolated fit is the one held to the target")  # fmt: skip
    print(f"{'policy':<24}{'meas_ms':>9}{'95% CI':>16}{'stream_ms':>10}{'ratio':>8}{'isolated_ms':>12}{'ratio':>8}"
          f"{'codec_ms':>10}{'step_ms':>9}  note")  # fmt: skip
    within: dict[str, list[bool]] = {k: [] for k in models}
    for _, r in t.iterrows():
        pol = r["policy"]
        meas = float(r["comm_time_us"]) / 1e3
        ci = f"{fmt(float(r['comm_time_ci_low_us']) / 1e3, '.2f')}..{fmt(float(r['comm_time_ci_high_us']) / 1e3, '.2f')}"
        cells, note, codec_ms = "", "", math.nan
        for kind, m in models.items():
            comp = plan_policies([get_policy(pol)], parts=TORCH_ADAMW, model=m, **dshape).iloc[0]
            codec_ms = comp["codec_time_s"] * 1e3
            p_ms = comp["comm_time_s"] * 1e3 - codec_ms
            rr = ratio(p_ms, meas)
            if not math.isnan(rr):
                within[kind].append(abs(rr - 1) <= 0.25)
            if math.isnan(p_ms):
                note = comp["comm_model"][:60]
            cells += f"{fmt(p_ms, '.2f'):>{10 if kind == 'stream' else 12}}{fmt(rr):>8}"
        print(f"{pol:<24}{fmt(meas, '.2f'):>9}{ci:>16}{cells}{fmt(codec_ms, '.2f'):>10}"
              f"{float(r['step_time_us_p50']) / 1e3:>9.1f}  {note}")  # fmt: skip
    for kind, w in within.items():
        print(f"# within 25 %, {kind} fit: {sum(w)} of {len(w)} priced policies (wire time, no overlap)")
    print("# json: " + json.dumps({"n": n, "psi": psi, **{f"within_25pct_{k}": int(sum(w)) for k, w in within.items()},
                                   "priced": len(within["isolated"])}))  # fmt: skip


if __name__ == "__main__":
    main()
