"""Pipeline parallelism on a spawned gloo world (training/pipeline_parallel.py): every rank's counted P2P sends and
all-reduces against Megatron-LM's figure written out here (b*s*h forward and b*s*h backward per stage boundary per
micro-batch, in the dtype crossing it; DDP's 2(n-1)/n over each stage's data-parallel group), the runner's
per-rank mean against the strategy's formula, and the step-0 loss and gradient norm against the unsplit model's on
the same weights and the same global batch. One world per size runs every PP policy."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tests.distutil import run_in_world
from tests.unsplit import unsplit_reference

SECTION = dict(
    model="gpt", batch_size=2, seq_len=8, d_model=32, n_layers=4, n_heads=4, vocab=64,
    steps=1, warmup_steps=1, measure_memory=False, comm_timed_steps=0, microbatches=4,
)  # fmt: skip
POLICIES = ("pp_gpipe_fp32", "pp_gpipe_bf16", "pp_1f1b_fp32", "pp_1f1b_bf16")
WIRE = ("pp_gpipe_bf16comm", "pp_1f1b_bf16comm", "pp_1f1b_fp16", "pp_1f1b_fp8comm")
"""Low precision on the wire: bf16 with fp32 compute, fp16 with its scaler, fp8 e4m3 codes + a scale per token."""
MULTI = ("pp_interleaved_fp32", "pp_interleaved_bf16", "pp_izb_fp32", "pp_zbv_fp32")
"""Several stages per rank: 4 stages of one block each on 2 ranks."""
BYTES = {"pp_gpipe_fp32": ("float", 4), "pp_1f1b_fp32": ("float", 4), "pp_interleaved_fp32": ("float", 4),
         "pp_izb_fp32": ("float", 4), "pp_zbv_fp32": ("float", 4), "pp_interleaved_bf16": ("bfloat16", 2),
         "pp_gpipe_bf16": ("bfloat16", 2), "pp_1f1b_bf16": ("bfloat16", 2), "pp_gpipe_bf16comm": ("bfloat16", 2),
         "pp_1f1b_bf16comm": ("bfloat16", 2), "pp_1f1b_fp16": ("half", 2), "pp_1f1b_fp8comm": ("uint8", 1)}  # fmt: skip
TOKEN_SCALES = {"pp_1f1b_fp8comm": 4}
"""Bytes per token beyond its h elements: fp8 e4m3 carries one float32 scale per token (row-wise scaling)."""
SCALED = {"pp_1f1b_fp16"}
"""ShardedGradScaler: one found-inf all-reduce of one float over the world per step."""
SENDS_ON_2 = {"pp_interleaved_fp32": (3, 3), "pp_interleaved_bf16": (3, 3), "pp_izb_fp32": (3, 3), "pp_zbv_fp32": (2, 2)}
"""Sends per micro-batch of ranks 0 and 1, worked by hand for 4 stages on 2 ranks. Looped (stage s on rank s mod 2):
boundaries 0>1, 1>2, 2>3 all cross; rank 0 sends forward at 0>1 and 2>3 and backward at 1<2: 3; rank 1 forward at
1>2, backward at 0<1 and 2<3: 3. ZBV (rank 0: stages 0 and 3, rank 1: 1 and 2): 1>2 stays on rank 1; rank 0 sends
forward at 0>1 and backward at 2<3, rank 1 forward at 2>3 and backward at 0<1: 2 each."""
THEORY = {"pp_interleaved_fp32": 2, "pp_interleaved_bf16": 2, "pp_izb_fp32": None, "pp_zbv_fp32": None}
"""v of the bubble (p-1)/(v m + p-1) (Narayanan et al. 2021); None: a zero-bubble schedule (no closed form)."""


def _stage_params(model: Any, p: int, pp: int) -> int:
    """Parameters of stage p: its n_layers/pp blocks, the embeddings on the first, ln_f and head on the last."""
    per = len(model.blocks) // pp
    mods = list(model.blocks)[p * per : (p + 1) * per]
    mods += [model.tok, model.pos] if p == 0 else []
    mods += [model.ln_f, model.head] if p == pp - 1 else []
    return sum(q.numel() for m in mods for q in m.parameters())


Layout = tuple[int, tuple[str, ...], tuple[int, ...]]
"""(pp_degree, policies, stage_layers: () for balanced stages)."""


def _key(pp_degree: int, name: str, split: tuple[int, ...]) -> str:
    return f"{pp_degree}/{name}" + (f"/{list(split)}" if split else "")


PROFILED = ("pp_1f1b_fp8comm", "pp_1f1b_fp16")
"""Profiled with torch.profiler in the 2-rank world: gloo's own events say what each send carried."""
PROFILED_STEP = 2
"""ProfilerStep#2 (step 0 the profiler's wait, step 1 its warm-up; the first schedule step exchanges shapes)."""


def _profiled(rank: int, out: str) -> dict[str, Any]:
    """Per PROFILED policy: the trace of one step and what the policy's counter counted in that step."""
    from pathlib import Path

    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from commbench.training.config import TrainingConfig
    from commbench.training.policies import get_policy
    from commbench.training.runner import PolicySession

    sec = TrainingConfig.coerce(SECTION)
    got: dict[str, Any] = {}
    for name in PROFILED:
        sess = PolicySession(get_policy(name).configure(sec), sec, torch.device("cpu"))
        path = Path(out) / name / f"rank{rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        with sess.counter, profile(
            activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=1, warmup=1, active=1),
            on_trace_ready=lambda p, path=path: p.export_chrome_trace(str(path)),
        ) as prof:  # fmt: skip
            for s in range(PROFILED_STEP + 1):
                sess.instrumented_step(s, numerics=False)
                if s == PROFILED_STEP:
                    got[name] = dict(trace=str(path), calls=dict(sess.counter.calls), size=dict(sess.counter.size_bytes))
                prof.step()
    return got


def _rank(rank: int, n: int, layouts: tuple[Layout, ...], out: str | None = None) -> dict[str, Any]:
    import torch

    from commbench.core import plugins
    from commbench.training.config import TrainingConfig
    from commbench.training.policies import get_policy
    from commbench.training.runner import PolicySession

    plugins.load()
    res: dict[str, Any] = {"p2p": _p2p_counts(rank, n), "profiled": _profiled(rank, out) if out else {}}
    for pp_degree, names, split in layouts:
        sec = TrainingConfig.coerce({**SECTION, "pp_degree": pp_degree, "stage_layers": list(split) or None})
        for name in names:
            sess = PolicySession(get_policy(name).configure(sec), sec, torch.device("cpu"))
            with sess.counter:
                sess.instrumented_step(0)  # the first schedule step also exchanges the stages' shapes
                sess.instrumented_step(1)
                calls, counted = dict(sess.counter.calls), sess.counter.snapshot()
                sess.timed_comm_step(2)  # its sends replayed one by one, timed; DDP's all-reduce timed in place
                timed = sess.counter.timed_calls()
                run = sess.finish()
            res[_key(pp_degree, name, split)] = dict(
                calls=calls, counted=counted, expected=run.comm_expected, mean=run.steps[1].comm,
                loss=run.steps[0].loss, grad_norm=run.steps[0].grad_norm, parallelism=sess.policy.sharding.parallelism,
                timed=timed, comm_time=run.comm_time_us.value if run.comm_time_us else None, profile=run.profile,
                skipped=[st.skipped for st in run.steps],
            )  # fmt: skip
    # The unsplit model, same seed (same weights), on the batches of every rank together.
    sec = TrainingConfig.coerce(SECTION)
    model, res["ref_loss"], res["ref_grad_norm"] = unsplit_reference(sec, n)
    res["stage_params"] = {pp: [_stage_params(model, p, pp) for p in range(pp)] for pp in (2, 4) if pp <= n}
    # layouts this world cannot form: every rank skips the policy with one line (run_training asks layout_error)
    # (what no world can run is refused when the suite loads: tests/test_training.py)
    res["skips"] = []
    for bad in ({"pp_degree": 3, "n_layers": 6, "microbatches": 3}, {"n_layers": 3 if n == 4 else 1, "pp_degree": 0}):
        reason = get_policy("pp_gpipe_fp32").configure(TrainingConfig.coerce({**SECTION, **bad})).sharding.layout_error(n)
        if reason:
            res["skips"].append(reason)
    return res


def _p2p_counts(rank: int, n: int) -> dict[str, Any]:
    """The counter on plain P2P calls, with each rank on a node of its own: `send`, `isend` and `batch_isend_irecv`
    counted by the sender only, as op "send", inter-node; in timed mode counted but not timed; `isend` restored."""
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from commbench.training.comm import CommCounter

    original = dist.isend
    counter = CommCounter(node_of_rank=tuple(range(n)))
    peer = rank ^ 1  # pairs (0, 1), (2, 3)
    with counter, counter.timed():
        if rank % 2 == 0:
            dist.send(torch.ones(10, dtype=torch.float16), dst=peer)
            dist.isend(torch.ones(5), dst=peer).wait()
        else:
            dist.recv(torch.empty(10, dtype=torch.float16), src=peer)
            dist.recv(torch.empty(5), src=peer)
        ops = [dist.P2POp(dist.isend, torch.ones(3), peer), dist.P2POp(dist.irecv, torch.empty(3), peer)]
        for work in dist.batch_isend_irecv(ops if rank % 2 == 0 else ops[::-1]):
            work.wait()
    return dict(calls=dict(counter.calls), links=counter.snapshot_links(), durations=list(counter.durations),
                restored=dist.isend is original and c10d.isend is original)  # fmt: skip


def _expected(rank: int, n: int, pp: int, name: str, stage_params: list[int]) -> dict[str, float]:
    """What `rank` sends in one step: M micro-batches of b*s*h per boundary it borders (forward to the next stage,
    backward to the previous), and with dp > 1 its stage's fp32 gradients all-reduced over dp ranks."""
    dtype, size = BYTES[name]
    m = SECTION["microbatches"]
    micro_tokens = SECTION["batch_size"] * pp // m * SECTION["seq_len"]  # the pipeline's batch: pp ranks' batches
    p = rank % pp
    borders = SENDS_ON_2[name][p] if name in SENDS_ON_2 else (p > 0) + (p < pp - 1)
    per_token = SECTION["d_model"] * size + TOKEN_SCALES.get(name, 0)
    out = {f"send:{dtype}": float(borders * m * micro_tokens * per_token)}
    dp = n // pp
    if dp > 1:
        out["all_reduce:float"] = 2 * (dp - 1) / dp * 4 * stage_params[p]
    if name in SCALED:
        out["all_reduce:float"] = out.get("all_reduce:float", 0.0) + 2 * (n - 1) / n * 4
    return out


def _check_timed(results: list[dict[str, Any]], r: int, key: str, pp: int, n: int, sends: int) -> None:
    """Point-to-point time measured (every send timed, none zero) and added up as comm_time_per_step's definition
    says: a send is the sender's alone, an all-reduce the minimum over its group, each rank's sum averaged over the
    ranks; the bubble's theory is (p-1)/(m+p-1) (Narayanan et al. 2021), the measured one a fraction."""
    got = results[r][key]
    own = [secs for secs, group in got["timed"] if tuple(group) == (r,)]
    assert len(own) == sends * SECTION["microbatches"] and all(s > 0 for s in own), key
    dp, world = n // pp, tuple(range(n))
    scaler = key.split("/")[1] in SCALED
    groups = [tuple(group) for _, group in got["timed"] if len(group) > 1]
    assert groups.count(world) == scaler, key  # the scaler's found-inf (no stage's data-parallel group is the world)
    ar = [g for g in groups if not (scaler and g == world)]
    assert all(g == tuple(range(r % pp, n, pp)) for g in ar)
    assert (len(ar) > 0) == (dp > 1), key  # PP x DP: the stage's all-reduce is in the comm time too

    def rank_sum(q: int) -> float:
        """q's sends plus, for its k-th call over a group, the smallest k-th duration of that group's ranks."""
        mine = [(secs, tuple(g)) for secs, g in results[q][key]["timed"]]
        total, seen = sum(secs for secs, g in mine if g == (q,)), dict[tuple[int, ...], int]()
        for _, g in mine:
            if len(g) > 1:
                k = seen[g] = seen.get(g, -1) + 1
                total += min([s for s, h in results[o][key]["timed"] if tuple(h) == g][k] for o in g)
        return total

    assert got["comm_time"] == pytest.approx(sum(rank_sum(q) for q in range(n)) / n * 1e6, rel=1e-9), key
    prof = got["profile"]
    m = SECTION["microbatches"]
    v = THEORY.get(key.split("/")[1], 1)
    if v is None:
        assert math.isnan(prof["bubble_frac_theory"]), key
    else:
        assert prof["bubble_frac_theory"] == pytest.approx((pp - 1) / (v * m + pp - 1), rel=1e-15), key
    assert 0.0 < prof["bubble_frac_measured"] < 1.0, key
    assert sorted(json.loads(prof["stage_busy_us"])) == sorted(json.loads(prof["stage_idle_us"])) == [str(p) for p in range(pp)]
    dirs = {"0:fwd", f"{pp - 1}:bwd"} | {f"{p}:{d}" for p in range(1, pp - 1) for d in ("fwd", "bwd")}
    if key.split("/")[1] in SENDS_ON_2:  # every rank sends both ways (the docstring of SENDS_ON_2)
        dirs = {f"{p}:{d}" for p in range(pp) for d in ("fwd", "bwd")}
    assert set(json.loads(prof["p2p_time_us"])) == dirs, key


def _check_world(results: list[dict[str, Any]], n: int, layouts: tuple[Layout, ...]) -> None:
    for pp_degree, names, split in layouts:
        pp = pp_degree or n
        for name in names:
            key = _key(pp_degree, name, split)
            per_rank = [_expected(r, n, pp, name, results[0]["stage_params"][pp]) for r in range(n)]
            mean: dict[str, float] = {}
            for e in per_rank:
                for k, v in e.items():
                    mean[k] = mean.get(k, 0.0) + v / n
            for r, res in enumerate(results):
                got = res[key]
                assert got["counted"] == per_rank[r], (key, r)
                sends = SENDS_ON_2[name][r % pp] if name in SENDS_ON_2 else (r % pp > 0) + (r % pp < pp - 1)
                assert got["calls"][f"send:{BYTES[name][0]}"] == sends * SECTION["microbatches"]
                assert got["mean"] == pytest.approx(mean, rel=1e-15, abs=0)  # the runner's mean over ranks
                assert got["expected"] == pytest.approx(mean, rel=1e-15, abs=0)  # the strategy's formula
                assert got["parallelism"] == ("pp+dp" if pp < n else "pp")
                # PP x DP: one flat all-reduce per step, nothing else (no DDP bitmap of unused parameters)
                assert got["calls"].get("all_reduce:float", 0) == (pp < n) + (name in SCALED), key
                # the pipeline computes the unsplit model's loss and gradients on the same global batch
                tol = 1e-5 if name.endswith("fp32") else 2e-2
                assert got["loss"] == pytest.approx(res["ref_loss"], rel=tol), key
                if name in SCALED:  # every stage skips a step together (the scaler's found-inf all-reduce)
                    assert got["skipped"] == results[0][key]["skipped"], key
                if name in SCALED and got["skipped"][0]:  # fp16 overflowed at the initial scale 2**16: no update
                    assert not math.isfinite(got["grad_norm"]), key
                else:
                    assert got["grad_norm"] == pytest.approx(res["ref_grad_norm"], rel=1e-4 if tol < 1e-3 else 5e-2), key
                _check_timed(results, r, key, pp, n, sends)
    for r, res in enumerate(results):
        p2p = res["p2p"]
        sent = {"send:half": 20.0, "send:float": 5 * 4 + 3 * 4.0} if r % 2 == 0 else {"send:float": 3 * 4.0}
        assert p2p["links"] == {"intra": {}, "inter": sent}
        assert p2p["calls"] == ({"send:half": 1, "send:float": 2} if r % 2 == 0 else {"send:float": 1})
        assert p2p["durations"] == [] and p2p["restored"]
    for res in results:
        assert len(res["skips"]) == 2
        assert all("\n" not in s for s in res["skips"])
        assert f"pp_degree=3 does not divide world_size={n}" in res["skips"][0]
        assert f"over {n} stages needs at least {n} layers" in res["skips"][1]


def _check_profiled(results: list[dict[str, Any]]) -> None:
    """gloo's own events (torch.profiler) against the counter, in the same step: as many sends, the same bytes.
    fp8 e4m3 sends are b*s tokens of h code bytes and a float32 scale each, moved as the float32 view autograd
    needs (the trace's dtype) and counted as the uint8 bytes they are; fp16 sends are b*s*h halves."""
    from pathlib import Path

    from commbench.store.traces import read_trace, step_calls

    m, h = SECTION["microbatches"], SECTION["d_model"]
    micro_tokens = SECTION["batch_size"] * 2 // m * SECTION["seq_len"]
    for rank, res in enumerate(results):
        for name, key, dtype, per_send in (
            ("pp_1f1b_fp8comm", "send:uint8", "float32", micro_tokens * (h + 4)),
            ("pp_1f1b_fp16", "send:half", "float16", micro_tokens * h * 2),
        ):
            got = res["profiled"][name]
            sends = [c for c in step_calls(read_trace(Path(got["trace"])), PROFILED_STEP) if c.collective == "send"]
            assert len(sends) == got["calls"][key] == m, (rank, name)  # each rank of 2 borders one boundary
            assert {c.dtype for c in sends} == {dtype} and {c.peer for c in sends} == {1 - rank}, (rank, name)
            assert [c.size_bytes for c in sends] == [per_send] * m, (rank, name)
            assert sum(c.size_bytes for c in sends) == got["size"][key], (rank, name)


@pytest.mark.timeout(300)
def test_pp_two_ranks(tmp_path: Any) -> None:
    # uneven stages (1 and 3 blocks): the same boundary bytes, the unsplit model's loss and gradients
    layouts = ((0, POLICIES + WIRE + MULTI, ()), (0, ("pp_1f1b_fp32",), (1, 3)))
    results = run_in_world(_rank, nproc=2, timeout=280, layouts=layouts, out=str(tmp_path))
    _check_world(results, 2, layouts)
    _check_profiled(results)


@pytest.mark.timeout(420)
def test_pp_four_ranks_and_pp_times_dp() -> None:
    layouts = ((0, POLICIES, ()), (2, ("pp_gpipe_fp32", "pp_1f1b_bf16"), ()))
    _check_world(run_in_world(_rank, nproc=4, timeout=400, layouts=layouts), 4, layouts)


def test_pp_policies_listed() -> None:
    from commbench.core import plugins
    from commbench.training.policies import get_policy, list_policies

    plugins.load()
    assert set(POLICIES) <= set(list_policies())
    bf16 = get_policy("pp_1f1b_bf16")
    assert bf16.autocast_name == "bfloat16" and bf16.reference == "pp_1f1b_fp32"
    assert bf16.comm_dtype == "bf16"
