"""Compare interconnects for real on one machine: the same commbench job on emulated hosts whose links are shaped
to each rate, then ``commbench compare`` of the runs, and the inter-node busbw ratio next to the rate ratio.

    sudo python benchmarks/interconnects.py --rates 1gbit,200mbit --nodes 2 --nproc-per-node 2 --out /tmp/ic

Each rate gets a fresh :class:`commbench.cluster.emulate.EmulatedCluster` (network namespaces on a bridge, every node's
link shaped with ``tc tbf`` both ways) and one torchrun job across it; its run directory is
``<out>/<nodes>x<nproc>-<rate>`` with an ``emulation.json`` naming the link. Expected: at the largest sizes the
busbw ratio between two rates follows the rate ratio (bandwidth-bound), while small sizes are latency-bound.
Only the world group for now: with ranks of one node on one stack, the ring's inter-node edges are the
bottleneck, so world busbw at large sizes is the link's rate.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import commbench  # noqa: E402
from commbench.cluster.emulate import EmulatedCluster, missing_requirements, rate_bits_per_s  # noqa: E402
from commbench.cluster.emulate_jobs import launch_job  # noqa: E402
from commbench.cluster.launch import cpu_model_name  # noqa: E402

# Samples of >= 50 ms: link-bound ops (tens of ms to seconds on the shaped link) take one op per sample (20 per
# sample at 200mbit would take minutes per point), while the fast unshaped intra-node ops take several, so the skew
# of the barrier that starts a sample (it crosses the shaped link) does not leak into their per-op time.
FAST = ["--min-time", "0.05", "--min-iters", "1", "--repeats", "3", "--warmup", "1", "--quiet", "--no-training"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--rates", default="1gbit,200mbit", help="comma-separated tc rates, fastest first (default 1gbit,200mbit)"
    )
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--nproc-per-node", type=int, default=2)
    p.add_argument("--collectives", default="all_reduce,all_gather")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("-b", "--minbytes", default="256K")
    p.add_argument("-e", "--maxbytes", default="16M")
    p.add_argument("--largest", type=int, default=2, help="how many of the largest sizes the ratio uses (default 2)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per job (default 900)")
    p.add_argument("--out", type=Path, required=True, help="directory for one run per rate and the comparison")
    args = p.parse_args(argv)
    args.rate_list = [r.strip() for r in args.rates.split(",") if r.strip()]
    if len(args.rate_list) < 2:
        p.error(f"--rates needs at least two rates, got {args.rates!r}")
    for r in args.rate_list:
        try:
            rate_bits_per_s(r)
        except ValueError as e:
            p.error(str(e))
    return args


def run_one(args: argparse.Namespace, rate: str) -> Path:
    out = args.out / f"{args.nodes}x{args.nproc_per_node}-{rate}"
    cb = ["run", "--collectives", args.collectives, "--precisions", args.precisions, "-b", args.minbytes,
          "-e", args.maxbytes, "-f", "4", "--groups", "world,intra,inter", "--out", str(out), *FAST]  # fmt: skip
    with EmulatedCluster(nodes=args.nodes, rate=rate) as cluster:
        print(cluster.describe(), flush=True)
        job = launch_job(cluster, args.nproc_per_node, cb, timeout=args.timeout)
        burst = cluster.burst
    print(
        f"# {rate}: job {'timed out' if job.timed_out else f'exit {job.returncode}'} in {job.seconds:.1f} s", flush=True
    )
    if job.returncode != 0:
        for r in job.nodes:
            sys.stderr.write(f"--- node{r.node.index} stderr ---\n{r.stderr[-3000:]}\n")
        raise SystemExit(f"the {rate} job failed")
    (out / "emulation.json").write_text(
        json.dumps(
            {"link": f"veth+bridge, tc tbf {rate} each direction (burst {burst})", "rate": rate,
             "rate_bits_per_s": rate_bits_per_s(rate), "nodes": args.nodes, "nproc_per_node": args.nproc_per_node,
             "job": list(job.argv)},
            indent=2,
        ) + "\n"
    )  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    why = missing_requirements()
    if why:
        print(f"interconnects: cannot emulate hosts here: {why}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    dirs = [run_one(args, rate) for rate in args.rate_list]
    cmp = subprocess.run(
        [sys.executable, "-m", "commbench", "compare", *map(str, dirs), "--labels", ",".join(args.rate_list),
         "--out", str(args.out / "compare")],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    sys.stdout.write(cmp.stdout)
    sys.stderr.write(cmp.stderr)

    import torch

    frames = [commbench.load(d) for d in dirs]
    base = args.rate_list[0]
    print(f"\n# busbw ratio {base} / other at the {args.largest} largest sizes, per group: inter-node groups should")
    print("# follow the rate ratio, intra-node groups (no shaped link) should not move")
    print(f"# {platform.node()}, {cpu_model_name()}, {os.cpu_count()} cores; torch {torch.__version__}; gloo; "
          f"{args.nodes} nodes x {args.nproc_per_node} ranks; {started}")  # fmt: skip
    print(f"{'group':<7}{'collective':<15}{'precision':<10}{'size':>10}  " + "".join(f"{r + ' GB/s':>14}" for r in args.rate_list)
          + "".join(f"{base + '/' + r:>18}" for r in args.rate_list[1:]) + "  expected")  # fmt: skip
    worst_inter = worst_intra = 0.0
    keys = ["group", "collective", "precision", "size_bytes"]
    for (grp, coll, prec), g in frames[0].groupby(["group", "collective", "precision"], sort=False):
        for size in sorted(g["size_bytes"].unique())[-args.largest :]:
            bw = [float(f.set_index(keys)["busbw_gbps"].get((grp, coll, prec, size), float("nan"))) for f in frames]
            ratios = [bw[0] / b for b in bw[1:]]
            # the intra-node group never crosses a shaped link: its ratio should stay 1
            expect = [1.0 if grp == "intra" else rate_bits_per_s(base) / rate_bits_per_s(r) for r in args.rate_list[1:]]
            dev = max(abs(r / e - 1) for r, e in zip(ratios, expect, strict=True))
            if grp == "inter":
                worst_inter = max(worst_inter, dev)
            elif grp == "intra":
                worst_intra = max(worst_intra, dev)
            print(f"{grp:<7}{coll:<15}{prec:<10}{size:>10}  " + "".join(f"{b:>14.4f}" for b in bw)
                  + "".join(f"{r:>18.2f}" for r in ratios) + "  " + " ".join(f"{e:.2f}" for e in expect))  # fmt: skip
    ok = worst_inter <= 0.2 and worst_intra <= 0.2
    print(f"# inter-node: largest deviation of the busbw ratio from the rate ratio {worst_inter:.0%} (target 20 %)")
    print(f"# intra-node: largest deviation from 1 {worst_intra:.0%} (target 20 %)")
    print(f"# runs: {', '.join(map(str, dirs))}; comparison: {args.out / 'compare'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
