"""Runs training steps under each precision policy and turns them into `training.csv` / `training_steps.csv` rows.

Called on every rank after `torch.distributed` is initialised (gloo/CPU or NCCL/GPU, same code). The fp32
baseline always runs first (prepended when the section does not list it): drift is measured against it. Each
policy is one session (`session.PolicySession`: build, wrap, steps, reduction); its rows come from
`records.build_rows`.

Before the first measured policy, one throwaway fp32 policy (two steps, no rows) primes the process on every
device: the first training step allocates process-lifetime state that no policy owns (on CUDA the cuBLAS workspace,
which torch allocates per handle and stream through the caching allocator and keeps, so it is in
`memory_allocated`: 32 MiB on sm90, the size the cuBLAS API reference recommends for Hopper at `cublasSetWorkspace`,
pytorch#120925; on CPU oneDNN primitives, gloo buffers, thread pools), which would otherwise land in the fp32
baseline's peak and inflate every `mem_saved_vs_fp32`.

A policy that fails on some ranks only (an out-of-memory, an error inside a backward's gradient reduction or a
pipeline schedule) must not leave the others inside a collective until the watchdog fires. Each policy is an epoch
of the run's `FailureBoard` (`commbench.cluster.failures`): a rank that fails posts its error through the rendezvous
store and aborts its process groups, every other rank's watcher sees the post within a second and aborts its own,
and every rank meets, starts a fresh default group and raises `PolicyFailed` naming each rank that failed first and
its error. Rank 0 records a row whose `error` says so, every rank drops the policy's model, and the next policy runs.

Every process group a policy made (HSDP's and TP x DP's meshes, a pipeline's groups) is destroyed when the policy
ends, so NCCL communicator memory, which the caching allocator does not see, does not grow from policy to policy;
DTensor's sharding-propagation cache goes with them (`compat.clear_dtensor_caches`: it would hand the next policy's
ops the destroyed meshes).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import socket
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from commbench.cluster import compat
from commbench.cluster.failures import POLL_S, FailureBoard, RanksFailed
from commbench.core.records import TrainingStep, TrainingSummary
from commbench.training.config import TrainingConfig
from commbench.training.policies import BASELINE, Policy, get_policy
from commbench.training.records import PolicyRun, StepRecord, build_rows, error_row, reference_of, skip_error
from commbench.training.session import Nodes, PolicySession, Wrapped, fsdp_units, run_policy
from commbench.training.sharding import Sharding

PolicyFailed = RanksFailed
"""Raised on every rank when a policy failed on some: `failures` names each rank that failed first and its error."""

__all__ = [
    "Nodes", "PolicyFailed", "PolicyRun", "PolicySession", "StepRecord", "Wrapped", "build_rows", "fsdp_units",
    "prime", "reference_of", "run_policy", "run_training",
]  # fmt: skip


def prime(section: TrainingConfig, device: torch.device, nodes: Nodes, sync: Callable[[], None] | None,
          board: FailureBoard) -> None:  # fmt: skip
    """One throwaway fp32 policy (a warm-up and a measured step, no rows, no memory measurement) before the first
    measured policy, on every device (module docstring). A failure here is agreed and is the fp32 baseline's
    too, which reports it."""
    quick = section.replace(steps=1, warmup_steps=1, measure_memory=False, comm_timed_steps=0)
    with contextlib.suppress(RanksFailed):
        board.epoch("priming", lambda: run_policy(get_policy(BASELINE), quick, device, nodes, sync, board))


def _destroy_groups_since(before: set[str]) -> None:
    """Destroy the process groups made since `before` (the policy's meshes and pipeline groups), after the garbage
    that still holds them (DDP reducers, FSDP states) is collected."""
    gc.collect()
    compat.destroy_groups_since(before)


def _agreed_environment_error(sharding: Sharding, device: torch.device, n: int) -> str | None:
    """`Sharding.environment_error` agreed by every rank (one object all-gather, before the policy's counting): the
    lowest rank's reason where any rank has one, so all skip together rather than some waiting in a collective."""
    every: list[Any] = [None] * n
    dist.all_gather_object(every, sharding.environment_error(device))
    return next((str(r) for r in every if r), None)


def run_training(
    section: TrainingConfig | Mapping[str, Any],
    *,
    device: torch.device,
    on_policy_done: Callable[[list[TrainingSummary], list[TrainingStep]], None] | None = None,
    skip: Collection[str] = (),
    hosts: Sequence[str] | None = None,
    sync: Callable[[], None] | None = None,
    poll_s: float | None = None,
) -> tuple[list[TrainingSummary], list[TrainingStep]]:
    """Run every policy of a `[training]` section; complete records on rank 0, empty lists elsewhere.

    `section` is a `TrainingConfig` (a plain table is validated into one). `hosts`: every rank's host name in
    rank order (`launch.Dist.hosts`; gathered here when not given): it splits comm bytes into intra- and
    inter-node and lays out node meshes.

    `skip` (the same on every rank) names policies already done, e.g. when resuming: they are not
    run, except the fp32 baseline, which still runs when another policy needs it but is not reported.

    `sync`: waits for the device (`launch.Dist.sync`; default: this device's synchronize). `poll_s`: how often the
    failure watcher asks the store (default `failures.POLL_S`).

    Must be called on every rank after `torch.distributed` is initialised. A policy that raises on any rank is
    agreed across ranks and skipped on all of them (`PolicyFailed`): rank 0 records a summary row whose `error`
    (and `warnings`) name each failing rank and its error, every rank drops the policy's model, and the next
    policy runs (module docstring). The default process group may be a fresh one afterwards: groups made before
    a failure are gone.
    """
    if not dist.is_initialized():
        raise RuntimeError("run_training needs torch.distributed initialised (call it on every rank)")
    sec = TrainingConfig.coerce(section)
    names = [p for p in sec.policies if p != BASELINE and p not in skip]
    if names or BASELINE not in skip:
        names.insert(0, BASELINE)  # the baseline always runs first: drift needs it
    rank, n = dist.get_rank(), dist.get_world_size()
    backend = str(dist.get_backend())
    if hosts is None:
        gathered: list[Any] = [None] * n
        dist.all_gather_object(gathered, socket.gethostname())
        hosts = [str(h) for h in gathered]
    nodes = Nodes.from_hosts(hosts)
    board = FailureBoard(device=device, poll_s=POLL_S if poll_s is None else poll_s)
    summary_rows: list[TrainingSummary] = []
    step_rows: list[TrainingStep] = []
    baseline: PolicyRun | None = None

    def report_row(row: TrainingSummary, steps: list[TrainingStep]) -> None:
        summary_rows.append(row)
        step_rows.extend(steps)
        if on_policy_done is not None:
            on_policy_done([row], steps)

    def one_policy(policy: Policy, report: bool) -> tuple[TrainingSummary, list[TrainingStep]] | None:
        nonlocal baseline
        run = run_policy(policy, sec, device, nodes, sync, board)
        if baseline is None and policy.name == BASELINE:
            baseline = run
        if not report:
            return None
        return board.run("building its rows", functools.partial(build_rows, run, baseline, sec, n, backend, device))

    try:
        if sec.measure_memory:
            prime(sec, device, nodes, sync, board)
        # What outlives every policy (torch's modules, the caches priming filled) leaves the collector's scan: each
        # policy's gc.collect() (its memory baseline, its groups' teardown) then walks only what policies made since,
        # not the whole interpreter (a full collection of it takes ~0.2 s on a 2-core VM, at least two per policy); undone below.
        gc.collect()
        gc.freeze()
        for name in names:
            policy = get_policy(name)
            report = rank == 0 and name not in skip
            sharding = policy.configure(sec).sharding
            # the world cannot form the layout (the same answer on every rank), or some rank cannot run it: one line
            reason = sharding.layout_error(n, nodes.count) or _agreed_environment_error(sharding, device, n)
            if reason:
                if report:
                    report_row(error_row(policy, sec, n, backend, device, skip_error(name, reason), agreed_failure=False), [])
                continue
            before = compat.group_names()
            try:
                rows = board.epoch(name, functools.partial(one_policy, policy, report))
                if rows is not None:
                    report_row(*rows)
            except RanksFailed as exc:  # agreed: every rank is here, with a fresh default group
                if report:
                    report_row(error_row(policy, sec, n, backend, device, str(exc)), [])
            finally:
                _destroy_groups_since(before)
    finally:
        board.close()
        gc.unfreeze()
    return summary_rows, step_rows
