"""Does the launcher change the number? The same sweep started by commbench's local spawn, by Open MPI's ``mpirun``
and by Slurm's ``srun`` (a private one-node Slurm on 127.0.0.1, ``tests/launchers/slurm_localhost.py``), compared
with ``python -m commbench compare`` (local spawn as the baseline: its ratios, intervals and significance).

    python benchmarks/bench_launchers.py                     # all_reduce fp32, 64K..4M, 2 ranks, 1 round
    python benchmarks/bench_launchers.py --rounds 2 -e 16M   # launchers interleaved round by round

Each launcher places its two ranks on a core each with one thread (the local spawn binds them; ``mpirun`` binds to
cores for two ranks by default; this Slurm's ``task/affinity`` binds each task), so the expectation is no
significant difference; a launcher that leaves ranks unbound or with more threads shows up here, and compare warns
when ``threads_per_rank`` differs. Also printed: each launcher's wall time for the whole command (start-up of the
launcher and of the ranks, the sweep, teardown), the cost a user pays per run. Needs root (or Open MPI and Slurm
usable by the user) and ``apt-get install openmpi-bin slurm-wlm munge``; a launcher that is missing is left out, with
the reason.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.launchers.slurm_localhost import SlurmUnavailable, slurm_localhost  # noqa: E402

LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV and not k.startswith(("SLURM_", "OMPI_", "PMI"))
    }
    env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback for every launcher (the local spawn sets it itself)
    return {**env, **extra}


def _timed(cmd: list[str], env: dict[str, str], log: Path) -> float:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        r = subprocess.run(cmd, env=env, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=1800)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"bench_launchers: {cmd[0]} exited with {r.returncode}; see {log}")
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-b", default="64K")
    parser.add_argument("-e", default="4M")
    parser.add_argument("-f", default="4")
    parser.add_argument("--collective", default="all_reduce")
    parser.add_argument("--rounds", type=int, default=1, help="runs per launcher, interleaved")
    parser.add_argument("--out", type=Path, help="keep the run directories here (default: a temporary directory)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-launchers-"))
    out.mkdir(parents=True, exist_ok=True)
    suite = ["run", "--collectives", args.collective, "--precisions", "fp32", "-b", args.b, "-e", args.e,
             "-f", args.f, "--quiet", "--no-report", "--no-training"]  # fmt: skip
    py = [sys.executable, "-m", "commbench", *suite]
    launchers: dict[str, list[str]] = {"local": [*py, "--nproc", "2"]}
    mpirun = shutil.which("mpirun")
    if mpirun:
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        launchers["mpirun"] = [mpirun, *root, "-np", "2", "-x", "GLOO_SOCKET_IFNAME", *py]
    else:
        print("# mpirun: not installed (apt-get install openmpi-bin); left out")
    walls: dict[str, list[float]] = {}
    runs: dict[str, list[Path]] = {}
    with ExitStack() as stack:
        slurm_env: dict[str, str] = {}
        try:
            slurm_env = stack.enter_context(slurm_localhost(out / "slurm")).env
            launchers["srun"] = ["srun", "-N", "1", "-n", "2", *py]
        except SlurmUnavailable as e:
            print(f"# srun: Slurm cannot run here ({str(e).splitlines()[0]}); left out")
        if len(launchers) < 2:
            print("# neither mpirun nor srun can run here: nothing to compare the local spawn with")
            return 2
        for r in range(args.rounds):
            for name, cmd in launchers.items():
                run_dir = out / f"{name}-{r}"
                wall = _timed([*cmd, "--out", str(run_dir)], _env(**slurm_env), out / f"{name}-{r}.log")
                walls.setdefault(name, []).append(wall)
                runs.setdefault(name, []).append(run_dir)
    print(f"# {args.collective} fp32 {args.b}..{args.e} x{args.f}, 2 ranks, {args.rounds} round(s); runs in {out}")
    for name, w in walls.items():
        print(f"# wall time of the whole command, {name:>6}: " + ", ".join(f"{x:.1f} s" for x in w))
    for r in range(args.rounds):
        names = list(launchers)
        cmp = [sys.executable, "-m", "commbench", "compare", *(str(runs[n][r]) for n in names),
               "--labels", ",".join(names), "--out", str(out / f"compare-{r}")]  # fmt: skip
        print(f"# round {r}: {' '.join(cmp[1:4])} ...")
        subprocess.run(cmp, cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
