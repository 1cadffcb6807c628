"""One policy's session on this rank: build and wrap the model, run its steps with the step clock, the memory
measurement and comm counting, and reduce what they measured across ranks (`PolicySession`, `run_policy`).

Per policy: build the model from the section seed (identical on every rank and for every policy), wrap it (DDP /
FSDP1 / FSDP2 / ZeRO / TP / PP), run `warmup_steps + steps` steps on identical data, and record per step: loss
(mean over ranks), global gradient norm, step time (max over ranks), skipped (GradScaler lowered its scale),
non-finite gradients, underflow fraction (`gradstats`) and the bus bytes counted by `CommCounter`. The step clock
covers forward, backward (with the gradient communication) and the optimizer step; the gradient statistics run
after the clock stops and their cross-rank reductions are deferred to the end of the policy, so instrumentation
adds no collective to a step. Between steps, outside the clock, one uncounted all-reduce of one element lines the
ranks up, so every step's clock starts together. The last warm-up step carries the memory measurement (its sampler
slows the step, so it is never a timed step); it is the growth over a baseline taken right before the model is
built (`memory.memory_baseline`).

Every phase (building, wrapping, each step, the final reduction) runs under the run's `FailureBoard`
(`commbench.cluster.failures`), when one is given: a rank that fails anywhere in it, inside a backward's reduction
or a pipeline schedule too, is named on every rank within seconds, not at the collective timeout.

After the measured steps, `comm_timed_steps` extra steps run with every collective made synchronous and timed
(`CommCounter.timed`): per call the minimum duration over ranks, summed per step, median over those steps is
`comm_time_us` (no overlap; codec encode/decode excluded). They add no step row and no step time.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.nn as nn

from commbench.cluster import launch
from commbench.cluster.failures import FailureBoard
from commbench.core import stats
from commbench.training import pairing
from commbench.training import pitfalls as pitfalls_mod
from commbench.training.comm import CommCounter, comm_time_per_step, dtype_name, wire_bytes
from commbench.training.config import TrainingConfig
from commbench.training.gradstats import BNInspector, GradStats
from commbench.training.memory import measure_step_memory, memory_baseline
from commbench.training.models import build_model, loss_fn, make_batch, param_count, tokens_per_sample
from commbench.training.policies import Policy, get_policy
from commbench.training.records import PolicyRun, StepRecord, close, mean_comm, reference_of
from commbench.training.strategies import FsdpUnit, Layout, autocast

T = TypeVar("T")


@dataclass
class Wrapped:
    """A model ready to train under a policy, plus what the formulas need to know about it."""

    model: nn.Module
    optimizer: Any
    scaler: Any | None
    layout: Layout




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
        board: FailureBoard | None = None,
    ) -> None:
        self.policy, self.section, self.device = policy, section, device
        self.board = board
        """Where a failure in a phase is posted and agreed; None: a phase's exception propagates as it is."""
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        self.nodes = nodes or Nodes((0,) * self.n)
        self.backend = str(dist.get_backend())
        self.sync: Callable[[], None] = sync if sync is not None else functools.partial(_sync, device)
        """Waits for the device: around the step clock and each timed collective."""
        self.counter = CommCounter(self.nodes.node_of_rank)
        self.notes: list[str] = []
        self.pitfalls: list[str] = []
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
        self.bn: BNInspector | None = BNInspector(self.w.model)
        self.grads = GradStats(self.policy, self.w.model, self.rank, self.n, device)
        self.peak_mem, self.peak_kind = math.nan, "none"
        # per step, local to this rank until finish(): [loss, sum g^2, underflowed, elements, nonfinite, has loss]
        self._local: list[torch.Tensor] = []
        self._times: list[float] = []
        self._meta: list[
            tuple[int, bool, dict[str, float], dict[str, dict[str, float]]]
        ] = []  # (step, skipped, comm, by link)
        self._durations: list[list[tuple[float, tuple[int, ...]]]] = []  # per timed comm step: (seconds, group) per call
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
        """`fn` as one phase of this policy under the run's failure board (no collective of its own)."""
        return self.board.run(phase, fn) if self.board is not None else fn()

    def align(self) -> None:
        """Line the ranks up between steps, outside the clock: one uncounted all-reduce of one element."""
        flag = torch.zeros(1, dtype=torch.int32, device=self.device)
        with self.counter.paused():
            dist.all_reduce(flag)

    def _autocast(self) -> Any:
        return autocast(self.policy.autocast, self.device)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward, backward (with the gradient communication), optimizer step. Returns the detached loss."""
        w = self.w
        # A pipeline runs forward and backward of every micro-batch in its schedule (the loss scaled by the scaler too).
        stepped = self.policy.sharding.pipeline_step(
            w.model, x, y, loss=loss_fn, scale=self.mult, autocast=self._autocast, scaler=w.scaler
        )
        if stepped is not None:
            self._optimizer_step()
            return stepped.detach()

        with self._autocast():
            logits = w.model(x)
        loss = loss_fn(logits, y)
        (w.scaler.scale(loss * self.mult) if w.scaler is not None else loss * self.mult).backward()
        self._optimizer_step()
        return loss.detach()

    def _optimizer_step(self) -> None:
        """The optimizer step (through the loss scaler, if any), then what the sharding needs after it."""
        w = self.w
        if w.scaler is not None:
            w.scaler.step(w.optimizer)
            w.scaler.update()
        else:
            w.optimizer.step()
        self.policy.sharding.after_optimizer_step(w.model)

    def bare_step(self, s: int) -> None:
        """The step as a user's loop runs it: no clock, no counting, no statistics."""
        x, y = self.batch(s)
        self.train_step(x, y)
        self.w.optimizer.zero_grad(set_to_none=True)

    def instrumented_step(self, s: int, *, measure_memory: bool = False, numerics: bool = True) -> None:
        """One step with its clock (or the memory measurement), comm bytes and gradient statistics."""
        w, device = self.w, self.device
        x, y = self.batch(s)
        scale_before = w.scaler.get_scale() if w.scaler is not None else 1.0
        box: list[torch.Tensor] = []
        self.counter.reset()
        if measure_memory:
            self.peak_mem, self.peak_kind = measure_step_memory(
                lambda: box.append(self.train_step(x, y)),
                w.model,
                w.optimizer,
                device,
                self.mem_base,
            )
            elapsed = math.nan
        else:
            self.sync()
            t0 = time.perf_counter()
            box.append(self.train_step(x, y))
            self.sync()
            elapsed = (time.perf_counter() - t0) * 1e6
        comm, links = self.counter.snapshot(), self.counter.snapshot_links()
        if self.bn is not None:  # one step is enough to see which dtypes BatchNorm runs in
            self.bn.remove()
        scale_after = w.scaler.get_scale() if w.scaler is not None else 1.0
        if numerics:
            self._local.append(self.grads.step(box[0], scale_before))
        w.optimizer.zero_grad(set_to_none=True)
        self._times.append(elapsed)
        self._meta.append((s, scale_after < scale_before, comm, links))

    def timed_comm_step(self, s: int) -> None:
        """An extra step, after the measured ones, with every collective synchronous and timed
        (`CommCounter.timed`, with this session's `sync`): its durations make `comm_time_us`; it adds no row and
        no step time."""
        x, y = self.batch(s)
        self.counter.reset()
        with self.counter.timed(sync=self.sync):
            self.train_step(x, y)
        self.w.optimizer.zero_grad(set_to_none=True)
        self._durations.append(self.counter.timed_calls())
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
        if any(not close(b, measured) for b in self._timed_bytes):
            notes.append("timed comm steps counted other bytes than the measured steps")
        return stats.median_ci([t * 1e6 for t in per_step])

    def finish(self) -> PolicyRun:
        """Reduce what the steps measured across ranks (four collectives, uncounted) and describe the run."""
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
        msg = pitfalls_mod.low_precision_grads(self.grads.dtype_pairs)
        if msg:
            pitfalls.append(msg)
        if self.bn is not None:
            pitfalls.extend(pitfalls_mod.batchnorm_low_precision(self.bn.seen))
        notes = list(self.notes)
        k = self.nodes.count
        expected_links = self.policy.comm_by_link(psi=self.psi, world_size=n, layout=self.w.layout, nodes=k)
        expected = self.policy.comm_bytes(psi=self.psi, world_size=n, layout=self.w.layout, nodes=k)
        measured = mean_comm([r for r in records if not r.warmup])
        wire, quirks = wire_bytes(measured, self.backend, n)
        notes.extend(quirks)
        # the timed steps are this rank's own: compared with this rank's measured steps, not the mean over ranks
        own = mean_comm([
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
            profile=self.policy.sharding.step_profile(self.w.model, self.warmup),
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


def _aligned(sess: PolicySession, step: Callable[[], None]) -> None:
    sess.align()
    step()


def run_policy(
    policy: Policy,
    section: TrainingConfig,
    device: torch.device,
    nodes: Nodes | None = None,
    sync: Callable[[], None] | None = None,
    board: FailureBoard | None = None,
) -> PolicyRun:
    """Train `warmup_steps + steps` steps under `policy`; collectives on the default group (and the groups its
    sharding makes). `nodes`: which node each rank is on (default: all on one); `sync`: waits for the device
    (default: this device's synchronize); `board`: the run's failure board (each phase runs under it: a failure
    on any rank is `RanksFailed` on every rank)."""
    # The suite's model-parallel degrees and micro-batches reach the policy's sharding here, once.
    sess = PolicySession(policy.configure(section), section, device, nodes, sync, board)
    total = sess.warmup + int(section.steps)
    mem_step = sess.warmup - 1 if section.measure_memory else -1
    with sess.counter:
        for s in range(sess.warmup):
            step = functools.partial(sess.instrumented_step, s, measure_memory=s == mem_step)
            sess.agreed(f"step {s}", functools.partial(_aligned, sess, step))
        # after the memory step: the partner's model is not in the policy's peak (training/pairing.py)
        partner, ref_name = _partner(sess, section, device, nodes, sync, board)
        if partner is not None:
            pairing.warm_partner(sess, partner, sess.warmup)
        pairing.run_rounds(sess, partner, sess.warmup, int(section.steps), int(section.round_steps))
        ref_times = sess.agreed("reducing the reference's times", functools.partial(pairing.reduced_times, sess, partner)) if partner else []
        del partner  # its model and groups go before the timed comm steps
        for s in range(total, total + int(section.comm_timed_steps)):
            sess.agreed(f"timed comm step {s}", functools.partial(_aligned, sess, functools.partial(sess.timed_comm_step, s)))
        run = sess.agreed("reducing the measurements", sess.finish)
    if ref_name:
        own = [r.step_time_us for r in run.steps if not r.warmup]
        run.paired = pairing.paired(ref_name, own, ref_times, int(section.round_steps))
    return run


def _partner(
    sess: PolicySession, section: TrainingConfig, device: torch.device, nodes: Nodes | None,
    sync: Callable[[], None] | None, board: FailureBoard | None,
) -> tuple[PolicySession | None, str]:
    """The reference's session the policy's measured steps alternate with (`pairing`), and its name; (None, "")
    where the policy is not compared, the suite says `paired = false`, or the world cannot form the reference."""
    name = reference_of(sess.policy)
    if not section.paired or not name or name == sess.policy.name or int(section.steps) == 0:
        return None, ""
    ref = get_policy(name).configure(section)
    if ref.sharding.layout_error(sess.n, sess.nodes.count):
        return None, ""
    return PolicySession(ref, section, device, nodes, sync, board), name
