"""Runs training steps under each precision policy and turns them into `training.csv` / `training_steps.csv` rows.

Called on every rank after `torch.distributed` is initialised (gloo/CPU or NCCL/GPU, same code).
Per policy (`PolicySession`): build the model from the section seed (identical on every rank and
for every policy), wrap it (DDP / FSDP1 / FSDP2 / ZeRO), run `warmup_steps + steps` steps on
identical data, and record per step: loss (mean over ranks), global gradient norm, step time (max
over ranks), skipped (GradScaler lowered its scale), non-finite gradients, underflow fraction and
the bus bytes counted by `CommCounter`. The step clock covers forward, backward (with the gradient
communication) and the optimizer step; the gradient statistics run after the clock stops and their
cross-rank reductions are deferred to the end of the policy, so instrumentation adds no collective
to a step. The last warm-up step carries the memory measurement (its sampler slows the step, so it
is never a timed step); it is the growth over a baseline taken right before the model is built
(`memory.memory_baseline`). On CPU two untimed fp32 steps first prime the process, so one-time
allocations are not charged to the first policy's memory.

A policy that fails on some ranks only (an out-of-memory, say) must not leave the others inside a collective
until the watchdog fires. Its work is split into phases separated by agreement points (`agree`): building the
model, wrapping it, the forward of every untimed step (warm-up and timed comm steps: before the backward's
gradient collectives), every step, and the final reduction. Each rank catches its own exception and reaches the
next agreement point, where the ranks all-reduce a failure flag (uncounted; outside the step clock) and, if any
rank failed, gather the errors: every rank raises `PolicyFailed` naming each failing rank and its error, drops
the policy's model (DDP/FSDP objects, then `gc.collect()`) and goes on with the next policy. This holds for
failures before a rank's collectives of a phase (allocations, model build, the forward under DDP, a local
optimizer step); a rank that fails between two collectives of one phase (inside FSDP's forward, say) still
leaves its peers waiting, which only the collective timeout ends. A measured step agrees after its clock stopped;
the agreement inside a warm-up step is in that step's time (its row has warmup=True and enters no summary).

After the measured steps, `comm_timed_steps` extra steps run with every collective made synchronous and timed
(`CommCounter.timed`): per call the minimum duration over ranks, summed per step, median over those steps is
`comm_time_us` (no overlap; codec encode/decode excluded). They add no step row and no step time.

Numerics are compared with the fp32 baseline, which always runs first (prepended when the section
does not list it): loss_drift = loss - loss_fp32 at the same step; grad_norm_drift =
(grad_norm - grad_norm_fp32) / grad_norm_fp32.

underflow_frac: fraction of the gradient elements (after communication, multiplied back by the
GradScaler scale when there is one, i.e. as the low-precision arithmetic saw them) whose magnitude
is at most half the smallest subnormal of the lowest precision the gradient went through
(`Policy.underflow`, the largest threshold of its stages): the values a cast to that precision rounds to zero,
exact zeros included. For a codec the threshold is relative to the gradient's amax, measured on the codec
(`hooks.codec_underflow`; fp8 e4m3 with per-tensor scaling: amax / 448 * 2**-10).
The fp32 baseline's figure is its fraction of exact zeros, the floor the pitfall detector compares
against.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import math
import socket
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.nn as nn

from commbench.cluster import launch
from commbench.core import stats
from commbench.core.records import TrainingStep, TrainingSummary
from commbench.training import pitfalls as pitfalls_mod
from commbench.training.comm import CommCounter, comm_time_per_step, dtype_name, wire_bytes
from commbench.training.config import TrainingConfig
from commbench.training.memory import measure_step_memory, memory_baseline
from commbench.training.models import build_model, loss_fn, make_batch, param_count, tokens_per_sample
from commbench.training.policies import BASELINE, Policy, get_policy
from commbench.training.strategies import FsdpUnit, Layout, Underflow, autocast

T = TypeVar("T")

# --- agreeing on failures across ranks -----------------------------------------------------------------

_SHOWN_ERRORS = 3  # distinct errors named in a PolicyFailed message; the rest are counted
_ERROR_CHARS = 400  # a CUDA out-of-memory message is ~350 characters


class PolicyFailed(RuntimeError):
    """Some ranks failed a phase of a policy; raised on every rank at the same agreement point.

    `failures`: (rank, error) of each failing rank, the error naming the phase it failed in on that rank.
    """

    def __init__(self, failures: Sequence[tuple[int, str]]) -> None:
        self.failures = list(failures)
        by_error: dict[str, list[int]] = {}
        for rank, error in self.failures:
            by_error.setdefault(error, []).append(rank)
        parts = [f"{_ranks(ranks)}: {error}" for error, ranks in list(by_error.items())[:_SHOWN_ERRORS]]
        rest = sum(len(ranks) for ranks in list(by_error.values())[_SHOWN_ERRORS:])
        if rest:
            parts.append(f"{rest} more rank{'s' if rest > 1 else ''} with other errors")
        super().__init__("; ".join(parts))


def _ranks(ranks: Sequence[int]) -> str:
    """ "rank 1", "ranks 0-3, 6": consecutive ranks as ranges (a large world's failures stay one short line)."""
    spans: list[list[int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"


def _describe(exc: BaseException, phase: str) -> str:
    message = " ".join(str(exc).split())
    if len(message) > _ERROR_CHARS:
        message = message[: _ERROR_CHARS - 3] + "..."
    return f"{type(exc).__name__}: {message} ({phase})" if message else f"{type(exc).__name__} ({phase})"


def agree(error: str | None, device: torch.device, counter: CommCounter | None = None) -> None:
    """An agreement point: every rank says whether it failed (`error`, or None); if any did, every rank raises
    `PolicyFailed` naming them. Two collectives when one failed, one otherwise, on the default group; not counted
    by `counter`. Every rank must reach it after the same collectives (see the module docstring)."""
    flag = torch.tensor([0 if error is None else 1], dtype=torch.int32, device=device)
    with counter.paused() if counter is not None else contextlib.nullcontext():
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if not int(flag.item()):
            return
        errors: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
    raise PolicyFailed([(rank, str(e)) for rank, e in enumerate(errors) if e is not None])


def agreed(phase: str, fn: Callable[[], T], device: torch.device, counter: CommCounter | None = None) -> T:
    """Run one phase of a policy, `fn`, then `agree` on whether it failed anywhere: its result when it failed
    nowhere, else `PolicyFailed` on every rank. A `PolicyFailed` from an agreement point inside `fn` passes
    through (already agreed)."""
    result, error = _attempt(fn, phase)
    agree(error, device, counter)
    return result  # type: ignore[return-value]  # None only where `agree` raised


def _attempt(fn: Callable[[], T], phase: str) -> tuple[T | None, str | None]:
    # The exception is turned into text here so nothing keeps its traceback, whose frames hold the policy's
    # model (and, on a GPU, its memory) after the policy is abandoned.
    try:
        return fn(), None
    except PolicyFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever stops a policy on one rank is agreed, then skips it
        return None, _describe(exc, phase)


# --- one policy --------------------------------------------------------------------------------------


@dataclass
class Wrapped:
    """A model ready to train under a policy, plus what the formulas need to know about it."""

    model: nn.Module
    optimizer: Any
    scaler: Any | None
    layout: Layout


@dataclass
class StepRecord:
    """What one step measured (already reduced over ranks where that is meaningful)."""

    step: int
    warmup: bool
    loss: float
    grad_norm: float
    step_time_us: float
    skipped: bool
    nonfinite: bool
    underflow_frac: float
    comm: dict[str, float]
    comm_links: dict[str, dict[str, float]] | None = None
    """`comm` split by link ("intra" / "inter")."""


def fsdp_units(model: nn.Module, policy: Policy, n: int) -> list[FsdpUnit]:
    """The FSDP units `policy`'s sharding creates for `model` on `n` ranks (padding included)."""
    return policy.sharding.units(policy.sharding.describe(model), n)


@dataclass(frozen=True)
class Nodes:
    """Which node every rank runs on (rank order), from the ranks' host names."""

    node_of_rank: tuple[int, ...]

    @classmethod
    def from_hosts(cls, hosts: Sequence[str]) -> Nodes:
        index: dict[str, int] = {}
        return cls(tuple(index.setdefault(h, len(index)) for h in hosts))

    @property
    def count(self) -> int:
        return len(set(self.node_of_rank))

    @property
    def node_major(self) -> bool:
        """Ranks numbered node by node, the same number on every node (what a 2-D mesh's rows assume)."""
        n, k = len(self.node_of_rank), self.count
        return n % k == 0 and self.node_of_rank == tuple(r // (n // k) for r in range(n))


def _wrap(
    policy: Policy, model: nn.Module, device: torch.device, lr: float, n: int, nodes: Nodes, tokens: int = 0
) -> Wrapped:
    sharding = policy.sharding
    if sharding.node_mesh and not nodes.node_major:
        raise ValueError(
            f"{sharding.kind} needs node-major ranks with as many on every node; node of each rank: {list(nodes.node_of_rank)}"
        )
    buffer_bytes: dict[str, int] = {}
    for b in model.buffers():
        key = dtype_name(b.dtype)
        buffer_bytes[key] = buffer_bytes.get(key, 0) + b.numel() * b.element_size()
    # Described before wrapping: FSDP replaces the parameters with flat or sharded ones.
    units = sharding.describe(model)
    activations = sharding.describe_activations(model)
    wrapped, opt = sharding.wrap(
        model.to(device), device=device, lr=lr, world_size=n, grad_comm=policy.grad_comm, nodes=nodes.count
    )
    layout = Layout(tuple(sharding.bucket_numels(wrapped)), units, buffer_bytes, activations, tokens)
    return Wrapped(wrapped, opt, policy.loss_scaling.make(device), layout)


def _sync(device: torch.device) -> None:
    """The default device synchronisation where the caller passes none (`launch.Dist.sync` is the run's)."""
    launch.synchronize(device)


def _grads(model: nn.Module) -> list[torch.Tensor]:
    out = []
    for p in model.parameters():
        g = p.grad
        if g is None:
            continue
        out.append(g._local_tensor if hasattr(g, "_local_tensor") else g)
    return out


def _grad_dtypes(model: nn.Module) -> set[tuple[torch.dtype, torch.dtype]]:
    pairs = set()
    for p in model.parameters():
        if p.grad is not None:
            pairs.add((p.dtype, p.grad.dtype))
    return pairs


def _underflow_threshold(low: Underflow, grads: list[torch.Tensor]) -> torch.Tensor | float:
    absolute, relative = low.absolute, low.relative
    if not relative:
        return absolute
    amax = max((g.detach().abs().max() for g in grads if g.numel()), default=torch.tensor(0.0))
    return (amax.double() * relative).clamp(min=absolute)  # lost in either stage: the larger threshold


class _BNInspector:
    """Forward pre-hooks on BatchNorm modules: records the input and running-stat dtypes of one step."""

    def __init__(self, model: nn.Module) -> None:
        self.seen: set[tuple[str, str]] = set()
        self.handles = [
            m.register_forward_pre_hook(self._hook)
            for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)
        ]

    def _hook(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0] if args else None
        in_dt = str(x.dtype).removeprefix("torch.") if isinstance(x, torch.Tensor) else "?"
        rm = getattr(module, "running_mean", None)
        buf_dt = str(rm.dtype).removeprefix("torch.") if isinstance(rm, torch.Tensor) else "none"
        self.seen.add((in_dt, buf_dt))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


@dataclass
class PolicyRun:
    """Everything measured for one policy (rank-reduced), before drift against the baseline."""

    policy: Policy
    steps: list[StepRecord]
    psi: int
    peak_mem_bytes: float
    peak_mem_kind: str
    model_state_bytes: int
    comm_expected: dict[str, float]
    comm_wire_bytes: float
    notes: list[str]
    pitfalls: list[str]
    error: str = ""
    nodes: int = 1
    comm_expected_inter: dict[str, float] | None = None
    comm_time_us: stats.Estimate | None = None
    """Communication time per step from the timed extra steps (`PolicySession.timed_comm_step`)."""


class PolicySession:
    """One policy's wrapped model and its step loop, with the instrumentation separable from the step.

    `bare_step` is the training step alone (what a user's loop does); `instrumented_step` adds
    the step clock, comm counting (when `counter` is installed) and, with `numerics`, the gradient
    statistics. Cross-rank reductions of what the steps measured are deferred to `finish`, so the
    instrumentation adds no collective to a step.
    """

    def __init__(
        self,
        policy: Policy,
        section: TrainingConfig,
        device: torch.device,
        nodes: Nodes | None = None,
        sync: Callable[[], None] | None = None,
    ) -> None:
        self.policy, self.section, self.device = policy, section, device
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        self.nodes = nodes or Nodes((0,) * self.n)
        self.backend = str(dist.get_backend())
        self.sync: Callable[[], None] = sync if sync is not None else functools.partial(_sync, device)
        """Waits for the device: around the step clock and each timed collective."""
        self.counter = CommCounter(self.nodes.node_of_rank)
        self.notes: list[str] = []
        self.pitfalls: list[str] = []
        # Building allocates (an out-of-memory on one rank is agreed before any collective); wrapping is
        # DDP's / FSDP's first collectives.
        model = self.agreed("building the model", self._build)
        self.w = self.agreed(
            "wrapping the model", lambda: _wrap(policy, model, device, float(section.lr), self.n, self.nodes, self._tokens())
        )
        self.notes.extend(policy.grad_comm.notes())
        if policy.autocast is not None and not launch.on_cuda(device):
            self.notes.append(_cpu_autocast_note(policy.autocast))
        self.pitfalls.extend(policy.pitfalls())
        self.mult = float(section.loss_multiplier)
        self.warmup = int(section.warmup_steps)
        self.bn: _BNInspector | None = _BNInspector(self.w.model)
        self.grad_dtype_pairs: set[tuple[torch.dtype, torch.dtype]] = set()
        self.peak_mem, self.peak_kind = math.nan, "none"
        # per step, local to this rank until finish(): [loss, sum g^2, underflowed, elements, nonfinite, has loss]
        self._local: list[torch.Tensor] = []
        self._times: list[float] = []
        self._meta: list[
            tuple[int, bool, dict[str, float], dict[str, dict[str, float]]]
        ] = []  # (step, skipped, comm, by link)
        self._share: list[int] | None = None
        self._durations: list[list[float]] = []  # per timed comm step: this rank's seconds per collective
        self._timed_bytes: list[dict[str, float]] = []  # per timed comm step: bus bytes by "op:dtype"

    def _tokens(self) -> int:
        """Tokens of one micro-batch of this rank's model (its data ranks' batches together)."""
        ranks = self.policy.sharding.data_ranks(self.rank, self.n)
        return self.policy.sharding.layout_tokens(len(ranks) * int(self.section.batch_size) * tokens_per_sample(self.section))

    def batch(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step `s`'s (inputs, targets): the batches of the sharding's data ranks for this rank, concatenated."""
        parts = [make_batch(self.section, r, s, self.device) for r in self.policy.sharding.data_ranks(self.rank, self.n)]
        if len(parts) == 1:
            return parts[0]
        return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])

    def _build(self) -> nn.Module:
        self.mem_base = memory_baseline(self.device)  # after the previous policy's model is gone
        model = build_model(self.section)
        self.psi = param_count(model)
        return model.to(self.device)

    def agreed(self, phase: str, fn: Callable[[], T]) -> T:
        """`fn` as one phase of this policy, agreed across ranks (module `agreed`), uncounted."""
        return agreed(phase, fn, self.device, self.counter)

    def _autocast(self) -> Any:
        return autocast(self.policy.autocast, self.device)

    def train_step(self, x: torch.Tensor, y: torch.Tensor, *, agree_forward: str | None = None) -> torch.Tensor:
        """Forward, backward (with the gradient communication), optimizer step. Returns the detached loss.

        `agree_forward` (a phase name): the forward is agreed across ranks before the backward starts its
        gradient collectives (an agreement point inside the step: untimed steps only)."""
        w = self.w
        # A pipeline runs forward and backward of every micro-batch in its schedule: no separate forward to agree on.
        stepped = self.policy.sharding.pipeline_step(w.model, x, y, loss=loss_fn, scale=self.mult, autocast=self._autocast)
        if stepped is not None:
            w.optimizer.step()
            return stepped.detach()

        def forward() -> torch.Tensor:
            with self._autocast():
                logits = w.model(x)
            return loss_fn(logits, y)

        loss = forward() if agree_forward is None else self.agreed(agree_forward, forward)
        if w.scaler is not None:
            w.scaler.scale(loss * self.mult).backward()
            w.scaler.step(w.optimizer)
            w.scaler.update()
        else:
            (loss * self.mult).backward()
            w.optimizer.step()
        return loss.detach()

    def bare_step(self, s: int) -> None:
        """The step as a user's loop runs it: no clock, no counting, no statistics."""
        x, y = self.batch(s)
        self.train_step(x, y)
        self.w.optimizer.zero_grad(set_to_none=True)

    def instrumented_step(
        self, s: int, *, measure_memory: bool = False, numerics: bool = True, agree_forward: bool = False
    ) -> None:
        """One step with its clock (or the memory measurement), comm bytes and gradient statistics.
        `agree_forward`: agree on the forward across ranks (`train_step`; not for a step whose time is reported)."""
        w, device = self.w, self.device
        x, y = self.batch(s)
        scale_before = w.scaler.get_scale() if w.scaler is not None else 1.0
        box: list[torch.Tensor] = []
        self.counter.reset()
        phase = f"the forward of step {s}" if agree_forward else None
        if measure_memory:
            self.peak_mem, self.peak_kind = measure_step_memory(
                lambda: box.append(self.train_step(x, y, agree_forward=phase)),
                w.model,
                w.optimizer,
                device,
                self.mem_base,
            )
            elapsed = math.nan
        else:
            self.sync()
            t0 = time.perf_counter()
            box.append(self.train_step(x, y, agree_forward=phase))
            self.sync()
            elapsed = (time.perf_counter() - t0) * 1e6
        comm, links = self.counter.snapshot(), self.counter.snapshot_links()
        if self.bn is not None:  # one step is enough to see which dtypes BatchNorm runs in
            self.bn.remove()
        scale_after = w.scaler.get_scale() if w.scaler is not None else 1.0
        if numerics:
            self._local.append(self._grad_stats(box[0], scale_before))
        w.optimizer.zero_grad(set_to_none=True)
        self._times.append(elapsed)
        self._meta.append((s, scale_after < scale_before, comm, links))

    def timed_comm_step(self, s: int, *, agree_forward: bool = False) -> None:
        """An extra step, after the measured ones, with every collective synchronous and timed
        (`CommCounter.timed`, with this session's `sync`): its durations make `comm_time_us`; it adds no row and
        no step time. `agree_forward`: agree on the forward across ranks (an uncounted, untimed collective)."""
        x, y = self.batch(s)
        self.counter.reset()
        with self.counter.timed(sync=self.sync):
            self.train_step(x, y, agree_forward=f"the forward of timed comm step {s}" if agree_forward else None)
        self.w.optimizer.zero_grad(set_to_none=True)
        self._durations.append(list(self.counter.durations))
        self._timed_bytes.append(self.counter.snapshot())

    def _gather_durations(self) -> list[Any] | None:
        """Every rank's timed-comm durations (one uncounted collective; none without timed comm steps)."""
        if not self._durations:
            return None
        gathered: list[Any] = [None] * self.n
        with self.counter.paused():
            dist.all_gather_object(gathered, self._durations)
        return gathered

    def _rank_mean_comm(self) -> list[tuple[dict[str, float], dict[str, dict[str, float]]]]:
        """Each step's counted bytes (by op, by link), the mean over ranks where the ranks differ (a pipeline's first
        and last stages send in one direction only), else this rank's own: one uncounted collective."""
        mine = [(comm, links) for _, _, comm, links in self._meta]
        if self.n == 1:
            return mine
        gathered: list[Any] = [None] * self.n
        with self.counter.paused():
            dist.all_gather_object(gathered, mine)
        if all(g == mine for g in gathered):
            return mine

        def mean(parts: list[dict[str, float]]) -> dict[str, float]:
            return {k: sum(p.get(k, 0.0) for p in parts) / len(parts) for k in sorted({k for p in parts for k in p})}

        return [
            (mean([g[i][0] for g in gathered]),
             {link: mean([g[i][1].get(link, {}) for g in gathered]) for link in mine[i][1]})
            for i in range(len(mine))
        ]  # fmt: skip

    def _comm_time(
        self, gathered: list[Any] | None, notes: list[str], measured: dict[str, float]
    ) -> stats.Estimate | None:
        """Median over the timed comm steps of the step's communication time, microseconds."""
        if gathered is None:
            return None
        try:
            per_step = comm_time_per_step(gathered)
        except ValueError as exc:
            notes.append(f"comm_time_us not measured: {exc}")
            return None
        if any(not _close(b, measured) for b in self._timed_bytes):
            notes.append("timed comm steps counted other bytes than the measured steps")
        if any(k.startswith("send:") for k in measured):
            notes.append("comm_time_us leaves out the point-to-point sends (not timed: see comm.py)")
        return stats.median_ci([t * 1e6 for t in per_step])

    def _my_share(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """This rank's part of the gradient tensors for the statistics.

        Sharded gradients: all of its (local) shards. Replicated gradients (DDP, ZeRO-1; tensor parallelism's
        replicated parameters: `Sharding.replicated_grad`) are identical on every rank, so the ranks split those
        tensors between them (greedy by size, the same split
        everywhere) and the sums add up across ranks: each rank does 1/n of the work.
        """
        if self.n == 1:
            return grads
        if self._share is None:
            sharding = self.policy.sharding
            with_grad = [p for p in self.w.model.parameters() if p.grad is not None]
            replicated = [sharding.replicated_grad(p) for p in with_grad]
            counted = [sharding.counts_grad(p, i) for i, p in enumerate(with_grad)]  # held alike by some ranks
            # split among the ranks that hold the same replicas (the world; a pipeline stage's data-parallel group)
            load = dict.fromkeys(sharding.replica_ranks(self.rank, self.n), 0)
            owner = [self.rank] * len(grads)  # a shard is this rank's own
            for i in sorted(range(len(grads)), key=lambda i: -grads[i].numel()):
                if counted[i] is not None:
                    owner[i] = self.rank if counted[i] else -1
                elif replicated[i]:
                    r = min(load, key=load.__getitem__)  # the first least-loaded rank
                    owner[i] = r
                    load[r] += grads[i].numel()
            self._share = [i for i, r in enumerate(owner) if r == self.rank]
        return [grads[i] for i in self._share]

    def _grad_stats(self, loss: torch.Tensor, scale: float) -> torch.Tensor:
        grads = self._my_share(_grads(self.w.model))
        self.grad_dtype_pairs |= _grad_dtypes(self.w.model)
        low = self.policy.underflow
        dev = self.device
        with torch.no_grad():
            if grads:
                # One fused pass for the norms; a non-finite element makes its tensor's norm non-finite.
                norms = torch.stack(torch._foreach_norm(grads)).double()
                sumsq = norms.pow(2).sum()
                nonfin = (~torch.isfinite(norms)).any().double()
            else:
                sumsq = nonfin = torch.zeros((), dtype=torch.float64, device=dev)
            under = torch.zeros((), dtype=torch.float64, device=dev)
            thr = _underflow_threshold(low, grads)
            if isinstance(thr, float) and thr == 0.0:
                for g in grads:  # fp32 itself: only exact zeros (counted without a temporary)
                    under += g.numel() - torch.count_nonzero(g)
            else:
                for g in grads:
                    # |g * scale| <= thr, with the threshold scaled once instead of every element
                    under += torch.count_nonzero(torch.abs(g).le_(thr / scale))
            count = float(sum(g.numel() for g in grads))
            # a pipeline's loss lives on its last stage: the reported loss is the mean over the ranks that have one
            has_loss = 1.0 if self.policy.sharding.reports_loss(self.rank, self.n) else 0.0
            return torch.stack(
                [loss.double().reshape(()).to(dev) * has_loss, sumsq, under,
                 torch.tensor(count, dtype=torch.float64, device=dev), nonfin,
                 torch.tensor(has_loss, dtype=torch.float64, device=dev)]
            )  # fmt: skip

    def finish(self) -> PolicyRun:
        """Reduce what the steps measured across ranks (four collectives, uncounted) and describe the run.

        The collectives come first, so a rank that fails describing the run reaches the next agreement point
        after the same collectives as its peers."""
        n, dev = self.n, self.device
        times = torch.tensor(
            [t if math.isfinite(t) else 0.0 for t in self._times]
            + [self.peak_mem if math.isfinite(self.peak_mem) else 0.0],
            dtype=torch.float64,
            device=dev,
        )
        stats = torch.stack(self._local) if self._local else torch.zeros((0, 6), dtype=torch.float64, device=dev)
        with self.counter.paused():
            dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a step lasts as long as its slowest rank
            dist.all_reduce(stats)
        durations = self._gather_durations()
        comms = self._rank_mean_comm()
        times_l, stats_l = times.tolist(), stats.tolist()
        if math.isfinite(self.peak_mem):
            self.peak_mem = times_l[-1]
        records: list[StepRecord] = []
        for i, (s, skipped, _, _) in enumerate(self._meta):
            comm, links = comms[i]
            loss_v = gn = under = math.nan
            nonfinite = False
            if i < len(stats_l):
                loss_sum, sumsq, und, count, nonfin, losses = stats_l[i]
                loss_v, gn = loss_sum / losses if losses else math.nan, math.sqrt(sumsq)
                under = und / count if count else math.nan
                nonfinite = nonfin > 0 or not math.isfinite(loss_v) or not math.isfinite(gn)
            records.append(
                StepRecord(
                    step=s,
                    warmup=s < self.warmup,
                    loss=loss_v,
                    grad_norm=gn,
                    step_time_us=times_l[i] if math.isfinite(self._times[i]) else math.nan,
                    skipped=skipped,
                    nonfinite=nonfinite,
                    underflow_frac=under,
                    comm=comm,
                    comm_links=links,
                )
            )
        pitfalls = list(self.pitfalls)
        # Gradients must come back in the parameter's dtype: no policy here asks for low-precision grads.
        msg = pitfalls_mod.low_precision_grads(self.grad_dtype_pairs)
        if msg:
            pitfalls.append(msg)
        if self.bn is not None:
            pitfalls.extend(pitfalls_mod.batchnorm_low_precision(self.bn.seen))
        notes = list(self.notes)
        k = self.nodes.count
        expected_links = self.policy.comm_by_link(psi=self.psi, world_size=n, layout=self.w.layout, nodes=k)
        expected = self.policy.comm_bytes(psi=self.psi, world_size=n, layout=self.w.layout, nodes=k)
        measured = _mean_comm([r for r in records if not r.warmup])
        wire, quirks = wire_bytes(measured, self.backend, n)
        notes.extend(quirks)
        # the timed steps are this rank's own: compared with this rank's measured steps, not the mean over ranks
        own = _mean_comm([
            StepRecord(s, False, math.nan, math.nan, math.nan, False, False, math.nan, comm)
            for s, _, comm, _ in self._meta if s >= self.warmup
        ])  # fmt: skip
        comm_time = self._comm_time(durations, notes, own)
        return PolicyRun(
            policy=self.policy,
            steps=records,
            psi=self.psi,
            peak_mem_bytes=self.peak_mem,
            peak_mem_kind=self.peak_kind,
            model_state_bytes=int(self.policy.state_bytes(psi=self.psi, world_size=n, nodes=k)),
            comm_expected=expected,
            comm_wire_bytes=wire,
            nodes=k,
            comm_expected_inter=expected_links["inter"],
            comm_time_us=comm_time,
            notes=notes,
            pitfalls=pitfalls,
        )


def _cpu_autocast_note(dtype: torch.dtype) -> str:
    """Why CPU autocast is usually slower than fp32 here, when it is: a property of this machine, not of the policy
    (on GPUs, autocast to 16 bits is faster)."""
    name = str(dtype).removeprefix("torch.")
    native = {
        torch.bfloat16: torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported(),
        torch.float16: torch.cpu._is_amx_fp16_supported(),
    }.get(dtype, False)
    if not native:
        return f"CPU autocast {name}: this CPU has no {name} math units, so {name} is emulated and slower than fp32 here"
    return f"CPU autocast {name}: casting weights and activations on every op costs more than {name} math saves on a model this small"


def run_policy(
    policy: Policy,
    section: TrainingConfig,
    device: torch.device,
    nodes: Nodes | None = None,
    sync: Callable[[], None] | None = None,
) -> PolicyRun:
    """Train `warmup_steps + steps` steps under `policy`; collectives on the default group (and, for a
    node mesh, its sub-groups). `nodes`: which node each rank is on (default: all on one); `sync`: waits for the
    device (default: this device's synchronize).

    Every phase is agreed across ranks (module docstring): `PolicyFailed` on every rank when any rank failed.
    A measured step's agreement comes after its clock stopped; untimed steps also agree on their forward."""
    # The suite's model-parallel degrees and micro-batches reach the policy's sharding here, once.
    sess = PolicySession(policy.configure(section), section, device, nodes, sync)
    total = sess.warmup + int(section.steps)
    mem_step = sess.warmup - 1 if section.measure_memory else -1
    with sess.counter:
        for s in range(total):
            step = functools.partial(
                sess.instrumented_step, s, measure_memory=s == mem_step, agree_forward=s < sess.warmup
            )
            sess.agreed(f"step {s}", step)
        for s in range(total, total + int(section.comm_timed_steps)):
            sess.agreed(f"timed comm step {s}", functools.partial(sess.timed_comm_step, s, agree_forward=True))
        return sess.agreed("reducing the measurements", sess.finish)


def _mean_comm(records: list[StepRecord], link: str | None = None) -> dict[str, float]:
    """Mean bus bytes per step by "op:dtype" (of one link's collectives when `link` is given)."""
    if not records:
        return {}
    per = [r.comm if link is None else (r.comm_links or {}).get(link, {}) for r in records]
    keys = sorted({k for c in per for k in c})
    return {k: sum(c.get(k, 0.0) for c in per) / len(records) for k in keys}


def _pct(values: list[float], q: float) -> float:
    vals = sorted(v for v in values if math.isfinite(v))
    if not vals:
        return math.nan
    # linear interpolation between closest ranks (numpy's default "linear" method)
    pos = (len(vals) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


# --- rows --------------------------------------------------------------------------------------------


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


def reference_of(policy: Policy) -> str:
    """The policy a row's low-precision gain is measured against, written into the row so the views need no
    registry: its own `reference` (the full-precision twin of the same parallelism), else the fp32 DDP baseline
    when some stage of it is narrower than fp32 (`Policy.underflow`: it loses elements fp32 keeps), else "" (a
    full-precision policy is a reference, not a gain)."""
    if policy.reference:
        return policy.reference
    low = policy.underflow
    return BASELINE if low.absolute > 0 or low.relative > 0 else ""


def build_rows(
    run: PolicyRun, baseline: PolicyRun | None, section: TrainingConfig, n: int, backend: str, device: torch.device
) -> tuple[TrainingSummary, list[TrainingStep]]:
    """Summary record and step records for one policy, with drift and gains against the fp32 baseline."""
    p = run.policy
    base_steps = {r.step: r for r in baseline.steps} if baseline is not None else {}
    step_rows: list[TrainingStep] = []
    for r in run.steps:
        b = base_steps.get(r.step)
        step_rows.append(
            TrainingStep(
                policy=p.name,
                step=r.step,
                warmup=r.warmup,
                loss=r.loss,
                grad_norm=r.grad_norm,
                step_time_us=r.step_time_us,
                skipped=r.skipped,
                nonfinite=r.nonfinite,
                underflow_frac=r.underflow_frac,
                loss_drift=r.loss - b.loss if b is not None else math.nan,
                grad_norm_drift=(r.grad_norm - b.grad_norm) / b.grad_norm
                if b is not None and b.grad_norm
                else math.nan,
                comm_bytes=sum(r.comm.values()),
            )
        )
    measured = [r for r in run.steps if not r.warmup]
    times = [r.step_time_us for r in measured]
    p50, p95 = _pct(times, 0.5), _pct(times, 0.95)
    samples = int(section.batch_size) * n / (p50 * 1e-6) if p50 and math.isfinite(p50) else math.nan
    comm_by_op = _mean_comm(measured)
    comm_inter = _mean_comm(measured, "inter")
    comm_total = sum(comm_by_op.values())
    expected_total = sum(run.comm_expected.values())
    skipped = sum(r.skipped for r in run.steps)
    nonfinite = sum(r.nonfinite for r in run.steps)
    underflow = sum(r.underflow_frac for r in run.steps) / len(run.steps) if run.steps else math.nan
    base_under = (
        sum(r.underflow_frac for r in baseline.steps) / len(baseline.steps) if baseline and baseline.steps else 0.0
    )
    pitfalls = list(run.pitfalls)
    msg = pitfalls_mod.fp16_unscaled(p, underflow, base_under, nonfinite, skipped)
    if msg:
        pitfalls.insert(0, msg)
    if comm_by_op and run.comm_expected and not _close(comm_by_op, run.comm_expected):
        run.notes.append("measured comm bytes differ from the formula")
    base_final = baseline.steps[-1] if baseline is not None and baseline.steps else None
    final = run.steps[-1] if run.steps else None
    gdrifts = [abs(row.grad_norm_drift) for row in step_rows if math.isfinite(row.grad_norm_drift)]
    base_summary = _base_numbers(baseline, section, n) if baseline is not None else {}
    # Step times are sampled policy after policy, so the speed-up is an unpaired ratio of the two medians'
    # order-statistic intervals (commbench.core.stats), not a paired one.
    step_ci = stats.median_ci(times)
    comm_time = run.comm_time_us or stats.Estimate(math.nan, math.nan, math.nan, 0)
    speedup = stats.Estimate(math.nan, math.nan, math.nan, 0)
    if baseline is not None:
        base_ci = stats.median_ci([r.step_time_us for r in baseline.steps if not r.warmup])
        speedup = stats.invert(stats.ratio_of(step_ci, base_ci)) if baseline is not run else stats.Estimate(1.0, 1.0, 1.0, 0)
    fields: dict[str, Any] = {
        "policy": p.name,
        "family": p.family,
        "parallelism": p.sharding.parallelism,
        "reference_policy": reference_of(p),
        "description": p.description,
        "comm_dtype": p.comm_dtype,
        "model": section.model,
        "params": run.psi,
        "world_size": n,
        "backend": backend,
        "device": str(device),
        "steps": len(measured),
        "warmup_steps": int(section.warmup_steps),
        "step_time_us_p50": p50,
        "step_time_us_p95": p95,
        "step_time_us_ci_low": step_ci.low,
        "step_time_us_ci_high": step_ci.high,
        "samples_per_s": samples,
        "tokens_per_s": samples * tokens_per_sample(section),
        "peak_mem_bytes": run.peak_mem_bytes,
        "peak_mem_kind": run.peak_mem_kind,
        "model_state_bytes": run.model_state_bytes,
        "model_state_kind": "analytic",
        "comm_bytes_per_step": comm_total,
        "comm_bytes_expected": expected_total,
        "comm_wire_bytes_per_step": run.comm_wire_bytes,
        "nodes": run.nodes,
        "comm_bytes_intra_per_step": sum(_mean_comm(measured, "intra").values()),
        "comm_bytes_inter_per_step": sum(comm_inter.values()),
        "comm_bytes_inter_expected": sum((run.comm_expected_inter or {}).values()),
        "comm_inter_by_op": json.dumps(comm_inter, sort_keys=True),
        "comm_by_op": json.dumps(comm_by_op, sort_keys=True),
        "comm_expected_by_op": json.dumps(run.comm_expected, sort_keys=True),
        "comm_time_us": comm_time.value,
        "comm_time_ci_low_us": comm_time.low,
        "comm_time_ci_high_us": comm_time.high,
        "final_loss": final.loss if final else math.nan,
        "final_loss_drift": final.loss - base_final.loss if final and base_final else math.nan,
        "max_grad_norm_drift": max(gdrifts) if gdrifts else math.nan,
        "skipped_steps": skipped,
        "nonfinite_steps": nonfinite,
        "underflow_frac": underflow,
        "speedup_vs_fp32": _ratio(base_summary.get("p50", math.nan), p50),
        "speedup_ci_low": speedup.low,
        "speedup_ci_high": speedup.high,
        "speedup_significant": stats.significant(speedup) if baseline is not None and baseline is not run else None,
        "mem_saved_vs_fp32": 1.0 - _ratio(run.peak_mem_bytes, base_summary.get("mem", math.nan)),
        "comm_saved_vs_fp32": 1.0 - _ratio(comm_total, base_summary.get("comm", math.nan)),
        "warnings": "; ".join(pitfalls),
        "notes": "; ".join(run.notes),
        "error": run.error,
    }  # fmt: skip
    summary = TrainingSummary(**fields)
    return summary, step_rows


def _close(a: dict[str, float], b: dict[str, float]) -> bool:
    keys = set(a) | set(b)
    return all(abs(a.get(k, 0.0) - b.get(k, 0.0)) <= 1e-6 * max(1.0, abs(b.get(k, 0.0))) for k in keys)


def _base_numbers(baseline: PolicyRun, section: TrainingConfig, n: int) -> dict[str, float]:
    measured = [r for r in baseline.steps if not r.warmup]
    return {
        "p50": _pct([r.step_time_us for r in measured], 0.5),
        "mem": baseline.peak_mem_bytes,
        "comm": sum(_mean_comm(measured).values()),
    }


def _error_rows(
    policy: Policy, section: TrainingConfig, n: int, backend: str, device: torch.device, err: str,
    agreed_failure: bool = True,
) -> TrainingSummary:
    """The row of a policy skipped on every rank: `error` names the failing ranks and their errors; `warnings`
    says so too (the console prints a row's warnings). Without `agreed_failure` (a layout the world cannot form)
    `err` is the whole line."""
    return TrainingSummary(
        policy=policy.name,
        family=policy.family,
        parallelism=policy.sharding.parallelism,
        reference_policy=reference_of(policy),
        description=policy.description,
        comm_dtype=policy.comm_dtype,
        model=section.model,
        world_size=n,
        backend=backend,
        device=str(device),
        steps=0,
        warnings=f"policy skipped on every rank: {err}" if agreed_failure else err,
        notes="",
        error=err,
    )


# --- entry point -------------------------------------------------------------------------------------


def run_training(
    section: TrainingConfig | Mapping[str, Any],
    *,
    device: torch.device,
    on_policy_done: Callable[[list[TrainingSummary], list[TrainingStep]], None] | None = None,
    skip: Collection[str] = (),
    hosts: Sequence[str] | None = None,
    sync: Callable[[], None] | None = None,
) -> tuple[list[TrainingSummary], list[TrainingStep]]:
    """Run every policy of a `[training]` section; complete records on rank 0, empty lists elsewhere.

    `section` is a `TrainingConfig` (a plain table is validated into one). `hosts`: every rank's host name in
    rank order (`launch.Dist.hosts`; gathered here when not given): it splits comm bytes into intra- and
    inter-node and lays out node meshes.

    `skip` (the same on every rank) names policies already done, e.g. when resuming: they are not
    run, except the fp32 baseline, which still runs when another policy needs it but is not reported.

    `sync`: waits for the device (`launch.Dist.sync`; default: this device's synchronize).

    Must be called on every rank after `torch.distributed` is initialised. A policy that raises on any rank is
    agreed across ranks and skipped on all of them (`PolicyFailed`): rank 0 records a summary row whose `error`
    (and `warnings`) name each failing rank and its error, every rank drops the policy's model, and the next
    policy runs.
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
    summary_rows: list[TrainingSummary] = []
    step_rows: list[TrainingStep] = []
    baseline: PolicyRun | None = None
    if sec.measure_memory and not launch.on_cuda(device):
        # Prime the process: the first training run allocates process-lifetime caches (oneDNN
        # primitives, gloo buffers, thread pools) that the heap measurement would charge to the
        # baseline. Two untimed fp32 steps, no rows.
        # A failure here (agreed) is the fp32 baseline's too, which reports it.
        with contextlib.suppress(PolicyFailed):
            run_policy(
                get_policy(BASELINE),
                sec.replace(steps=1, warmup_steps=1, measure_memory=False, comm_timed_steps=0),
                device,
                nodes,
                sync,
            )
        gc.collect()
    for name in names:
        policy = get_policy(name)
        report = rank == 0 and name not in skip
        error = ""
        reason = policy.configure(sec).sharding.layout_error(n, nodes.count)
        if reason:  # the world cannot form the layout: one line, nothing run (the same answer on every rank)
            if report:
                row = _error_rows(policy, sec, n, backend, device, f"{name} skipped: {reason}", agreed_failure=False)
                summary_rows.append(row)
                if on_policy_done is not None:
                    on_policy_done([row], [])
            continue
        try:
            run = run_policy(policy, sec, device, nodes, sync)
            if baseline is None and name == BASELINE:
                baseline = run
            rows = agreed(
                "building its rows",
                functools.partial(build_rows, run, baseline, sec, n, backend, device) if report else lambda: None,
                device,
            )
        except PolicyFailed as exc:  # agreed: every rank is here, after the same collectives
            error = str(exc)
        if error:
            gc.collect()  # the abandoned DDP/FSDP model and its buckets, before the next policy's baseline
            if report:
                row = _error_rows(policy, sec, n, backend, device, error)
                summary_rows.append(row)
                if on_policy_done is not None:
                    on_policy_done([row], [])
            continue
        if rows is not None:
            summary, steps = rows
            summary_rows.append(summary)
            step_rows.extend(steps)
            if on_policy_done is not None:
                on_policy_done([summary], steps)
    return summary_rows, step_rows
