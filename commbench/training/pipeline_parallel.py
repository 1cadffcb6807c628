"""Pipeline parallelism (GPipe, 1F1B) on the GPT with `torch.distributed.pipelining`, as a `Sharding` and its
policies; PP x DP (each stage's gradients averaged over its data-parallel ranks) when the pipeline is shorter than the world.

Layout: a (dp, pp) mesh laid out row-major, so pipeline d is the consecutive ranks d*pp .. d*pp+pp-1 (stage p on
rank d*pp+p) and the data-parallel group of stage p is the ranks p, pp+p, 2pp+p, ... The GPT is split by hand
(`nets.GPTStage`): stage 0 holds the embeddings and the first n_layers/pp blocks, the last stage the last blocks, the
final LayerNorm and the head. Each rank builds one `PipelineStage` and runs a `ScheduleGPipe` or `Schedule1F1B` of
`microbatches` micro-batches; with dp > 1, after the schedule step, the stage's gradients are all-reduced over its
data-parallel group as one flat fp32 buffer (`dist.all_reduce`, counted and timed) and averaged, as DDP would. Not
DDP itself: DDP under torch's pipelining needs `find_unused_parameters=True` (its first-iteration bucket rebuild
otherwise records every micro-batch's backward and asserts on the second step), which adds an uncounted bitmap
all-reduce of the unused parameters every step.

Bytes (Narayanan et al. 2021, section 2.2 / 3.3): per stage boundary per micro-batch of b samples of s tokens, the
forward sends the b*s*h activation to the next stage and the backward sends its b*s*h gradient back, in the
dtype that crosses the boundary (`act_dtype_name`: the bf16 policies cast the stage output to bf16 before sending,
so both directions travel in bf16; the receiving stage computes in fp32 or under autocast as the unsplit model
does). Only sends are counted (op "send", bus factor 1 as nccl-tests' sendrecv): what a rank puts on the wire.
A pipeline of pp stages has pp - 1 boundaries, so over a step its ranks send 2 (pp - 1) M b s h elements
(M micro-batches); stage 0 and the last stage send M b s h, the middle ones 2 M b s h. `comm_bytes` is the
figure per rank averaged over the world (the world's total over its size): 2 (pp - 1) / pp * M * b*s*h * bytes.
With dp > 1 each stage all-reduces its fp32 gradients over dp ranks once per step: on average over the ranks
2 (dp - 1) / dp * 4 * Psi / pp bytes (every stage's Psi_p summed over the stages is Psi).

What the formula needs beyond Psi: `Layout.tokens` = b*s, the tokens of ONE micro-batch as a pipeline computes
it, and `Layout.activations` = ((BOUNDARY, h),), the features of the activation that crosses a boundary
(`PipelineParallel.layout(tokens=b*s, hidden=h)` builds it). A planner asks
`PipelineParallel(pp=8, microbatches=16, act_dtype_name=BF16).comm_bytes(psi=..., world_size=64,
layout=PipelineParallel.layout(tokens=b * s, hidden=h))`.

Data: the ranks of a pipeline compute one batch together, so each of them trains on the batches of every rank of
its pipeline, concatenated (`data_ranks`), split into `microbatches` equal micro-batches: the pipeline sees the
global tokens the data-parallel ranks it replaces see, and its loss (the mean of the micro-batches' mean losses) and
gradients (summed over micro-batches, divided by M: `scale_grads`) are those of the fp32 DDP baseline's global
batch. The loss exists on the last stage only; the runner averages it over the ranks that report one
(`reports_loss`).

Failures: a schedule step has no separate forward the runner could agree on before the backward's communication,
so a rank that fails inside the schedule leaves its neighbours waiting on their P2P receives until the
collective timeout; layouts a world cannot form are refused before anything runs (`layout_error`), and a batch
that does not split into the micro-batches is refused on every rank before any send (`pipeline_step`). The
pipeline and data-parallel groups are created per policy run (`dist.new_group`, collective over the world).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from commbench.training.comm import CommCounter, bus_factor, dtype_name
from commbench.training.p2p_timing import profile, time_transfers
from commbench.training.policies import Policy, register_policy
from commbench.training.pp_schedules import GPIPE, INTERLEAVED, INTERLEAVED_ZB, ONE_F_ONE_B, SCHEDULES, ZBV, balanced
from commbench.training.pp_schedules import split_error as stage_split_error
from commbench.training.strategies import (
    ADAM_FP32,
    BF16,
    DTYPE_UNDERFLOW,
    FP16,
    FP32,
    INTER,
    INTRA,
    NO_SCALING,
    SHORT,
    GradComm,
    Layout,
    LossScaling,
    ModelState,
    ShardedGradScaling,
    Sharding,
    Underflow,
    World,
    add_bytes,
    blocks,
)

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

BOUNDARY = "boundary"
"""`Layout.activations` label of the activation that crosses a stage boundary."""



@dataclass(frozen=True, slots=True)
class PipelineParallel(Sharding):
    """Pipeline parallelism over `pp` stages (0: the whole world), PP x DP when `pp` divides a larger world.

    `act_dtype_name`: the dtype the activations and their gradients cross stage boundaries in; `microbatches`: M;
    `schedule`: "gpipe" or "1f1b". The byte formula (module docstring) needs `Layout.tokens` = b*s of one
    micro-batch and `Layout.activations` = ((BOUNDARY, h),): see `layout`."""

    kind: str = "pp"
    parallelism: str = "pp"
    shards_grads: bool = True
    takes_hooks: bool = False
    pp: int = 0
    """Stages per pipeline; 0: the whole world (no data parallelism)."""
    microbatches: int = 4
    """Micro-batches per step (M)."""
    schedule: str = GPIPE
    """A `pp_schedules.SCHEDULES` name: "gpipe" (all forwards, then all backwards), "1f1b" (one forward, one backward
    in the steady state), "interleaved_1f1b", "interleaved_zb" (v stages per rank, looped), "zbv" (two, in a V)."""
    virtual: int = 2
    """Stages per rank of the looped schedules (the suite's virtual_stages; GPipe and 1F1B hold one, ZBV two)."""
    stage_layers: tuple[int, ...] = ()
    """Blocks of each stage, first to last; (): balanced (`pp_schedules.balanced`)."""
    act_dtype_name: str = FP32
    """torch's name of the dtype crossing the stage boundaries (both directions)."""
    codec: str | None = None
    """A `commbench.measure.codec` name: the boundaries carry its wire bytes (codes + a float32 scale per token, both
    directions; `pp_wire`) instead of a cast to `act_dtype_name`."""
    n_layers: int = 0
    """The suite model's blocks (from `configure`; 0: not known, not checked by `layout_error`)."""
    batch: int = 0
    """Samples per rank per step, the suite's batch_size (from `configure`; 0: not known)."""
    hidden: int = 0
    """The suite model's d_model, what crosses a boundary per token (from `configure`; 0: not known)."""

    @staticmethod
    def layout(*, tokens: int, hidden: int) -> Layout:
        """What the byte formula needs: `tokens` of one micro-batch (b*s) and the boundary's features `hidden` (h)."""
        return Layout(activations=((BOUNDARY, int(hidden)),), tokens=int(tokens))

    def degree(self, world_size: int) -> int:
        """Stages per pipeline (ValueError, one line, when the world cannot form the layout)."""
        pp = self.pp or world_size
        if pp < 2:
            raise ValueError(f"pipeline parallelism needs at least 2 stages; world_size={world_size}, pp_degree={self.pp}")
        if world_size % pp:
            raise ValueError(
                f"pipeline parallelism: pp_degree={pp} does not divide world_size={world_size}; "
                f"valid: a divisor of {world_size} (>= 2), or 0 for the whole world"
            )
        return pp

    def stage_of(self, rank: int, world_size: int) -> tuple[int, int]:
        """(pipeline index d, stage p) of `rank` on the (dp, pp) mesh."""
        pp = self.degree(world_size)
        return rank // pp, rank % pp

    def configure(self, section: Any) -> PipelineParallel:
        """pp_degree and microbatches from the suite's `[training]` table; "pp+dp" when, in the running world, the
        pipeline is shorter than the world."""
        pp, m = int(getattr(section, "pp_degree", 0)), int(getattr(section, "microbatches", self.microbatches))
        par = "pp"
        import torch.distributed as dist  # configure runs inside a policy run: the world is initialised

        if pp and dist.is_available() and dist.is_initialized() and dist.get_world_size() > pp:
            par = "pp+dp"
        layers = int(getattr(section, "n_layers", 0)) if getattr(section, "model", "gpt") == "gpt" else -1
        given = tuple(int(k) for k in getattr(section, "stage_layers", None) or ())
        return replace(
            self, pp=pp, microbatches=m, parallelism=par, n_layers=layers, batch=int(getattr(section, "batch_size", 0)),
            hidden=int(getattr(section, "d_model", 0)),
            virtual=int(getattr(section, "virtual_stages", self.virtual)), stage_layers=given,
        )  # fmt: skip

    @property
    def plan(self) -> Any:
        """The schedule's `pp_schedules.Schedule`."""
        return SCHEDULES[self.schedule]

    def total_stages(self, pp: int) -> int:
        """Stages over the whole pipeline: pp ranks times the stages each holds."""
        return pp * self.plan.per_rank(self.virtual)

    def splits(self, pp: int, layers: int) -> tuple[int, ...]:
        """Blocks of each stage: the given `stage_layers`, else balanced."""
        return self.stage_layers or balanced(layers, self.total_stages(pp))

    def config_error(self, section: Any) -> str | None:
        """What no world can run: a model other than the gpt, a given pp_degree above the layers or not splitting
        them, a pipeline batch that does not split into the micro-batches, 1F1B with fewer micro-batches than
        stages (its warm-up needs one in flight per stage)."""
        if getattr(section, "model", "gpt") != "gpt":
            return f"pipeline parallelism needs the gpt model (its blocks are split into stages); model={section.model}"
        pp, m, layers = int(section.pp_degree), int(section.microbatches), int(section.n_layers)
        given = tuple(getattr(section, "stage_layers", None) or ())
        reason = self._wire_error(int(getattr(section, "d_model", 0)))
        if reason:
            return reason
        return replace(self, stage_layers=given, virtual=int(getattr(section, "virtual_stages", self.virtual))).split_error(
            pp, m, layers, int(section.batch_size)) if pp else None  # fmt: skip

    def split_error(self, pp: int, m: int, layers: int, batch: int) -> str | None:
        """Why `pp` stages cannot split `layers` blocks and the pipeline's batch into `m` micro-batches, or None."""
        return stage_split_error(layers, self.total_stages(pp), self.stage_layers) or self.plan.microbatch_error(pp, m) or (
            self._batch_error(pp, m, batch))  # fmt: skip

    def _wire_error(self, hidden: int) -> str | None:
        """Why `hidden` features per token cannot cross a boundary through the codec, or None."""
        if not self.codec or not hidden:
            return None
        from commbench.measure.codec import get_codec

        b = get_codec(self.codec).wire_bytes(hidden)
        if b % 4:  # the wire travels as a float32 view (pp_wire)
            return (
                f"pipeline parallelism through {self.codec}: a token's wire of {b} bytes (d_model={hidden} codes + "
                "scales) is not a whole number of float32 words; valid: a d_model whose wire is a multiple of 4 bytes "
                "(fp8_e4m3: d_model a multiple of 4)"
            )
        return None

    @staticmethod
    def _batch_error(pp: int, m: int, batch: int) -> str | None:
        if batch and (batch * pp) % m:
            return (
                f"pipeline parallelism: the pipeline's batch of {batch * pp} samples (batch_size x pp) does not "
                f"split into microbatches={m}; valid: a divisor of {batch * pp}"
            )
        return None

    def layout_error(self, world_size: int, nodes: int = 1) -> str | None:
        """Why this world cannot form the pipeline (one line), or None: a degree that does not divide the world,
        a model other than the gpt, layers that do not split evenly, a batch that does not split into the
        micro-batches."""
        try:
            pp = self.degree(world_size)
        except ValueError as exc:
            return str(exc)
        if self.n_layers < 0:
            return "pipeline parallelism needs the gpt model (its blocks are split into stages)"
        return self._wire_error(self.hidden) or self.split_error(pp, self.microbatches, self.n_layers, self.batch)

    def data_ranks(self, rank: int, world_size: int) -> tuple[int, ...]:
        pp = self.degree(world_size)
        first = rank // pp * pp
        return tuple(range(first, first + pp))

    def replica_ranks(self, rank: int, world_size: int) -> tuple[int, ...]:
        """The data-parallel group of `rank`'s stage: the ranks holding the same (all-reduced) gradients."""
        pp = self.degree(world_size)
        return tuple(range(rank % pp, world_size, pp))

    def replicated_grad(self, param: Any) -> bool:
        # Replicated over the stage's data-parallel group (`replica_ranks`; a group of one rank without DP).
        return True

    def reports_loss(self, rank: int, world_size: int) -> bool:
        """Only the rank holding the last stage computes the loss."""
        pp = self.degree(world_size)
        return self.stage_of(rank, world_size)[1] == self.plan.rank_of(self.total_stages(pp) - 1, pp)

    def layout_tokens(self, step_tokens: int) -> int:
        """`Layout.tokens` is one micro-batch's: the step's tokens over M."""
        return step_tokens // self.microbatches

    def describe_activations(self, model: nn.Module) -> tuple[tuple[str, int], ...]:
        """The boundary activation's features: the GPT's hidden size (its blocks' LayerNorm width)."""
        bs = blocks(model)
        ln1: Any = getattr(bs[0], "ln1", None) if bs else None
        return ((BOUNDARY, int(ln1.normalized_shape[0])),) if ln1 is not None else ()

    def comm_dtype(self, grad_comm: GradComm) -> str:
        return self.codec or SHORT[self.act_dtype_name]

    def comm_underflow(self, grad_comm: GradComm) -> Underflow:
        # The activation gradients cross the boundaries in act_dtype (or the codec, its threshold measured on the
        # codec as the DDP codec hook's); the data-parallel gradient all-reduce stays fp32.
        if self.codec:
            from commbench.training.hooks import codec_underflow

            return Underflow(self.codec, relative=codec_underflow(self.codec))
        return DTYPE_UNDERFLOW[self.act_dtype_name]

    # --- formulas -----------------------------------------------------------------------------------

    def _boundary_send(self, layout: Layout) -> tuple[str, int]:
        """("send:<type>", bytes) of one micro-batch's send at one boundary: b*s*h elements of act_dtype, or with a
        codec b*s tokens of its wire bytes (h codes + scales each) counted as uint8 (0 without a layout)."""
        from commbench.measure.precision import torch_dtype

        h = sum(f for label, f in layout.activations if label == BOUNDARY)
        if self.codec:
            from commbench.measure.codec import get_codec

            return "send:uint8", layout.tokens * get_codec(self.codec).wire_bytes(h) if h else 0
        return f"send:{dtype_name(self.act_dtype_name)}", layout.tokens * h * torch_dtype(self.act_dtype_name).itemsize

    def send_bytes_of_rank(self, rank: int, w: World) -> dict[str, dict[str, float]]:
        """Bytes `rank` sends per step, by link then "op:dtype": its P2P sends (forward to the next stage, backward
        to the previous one, M each, over every boundary between two of its stages and another rank's) and its stage's data-parallel all-reduce (bus bytes, Psi/pp of the model: the
        stages' own Psi_p are not in a Psi-only description). Links: a send is INTER when its two ranks sit on
        different nodes, an all-reduce when its group spans nodes (ranks numbered node-major, as the runner checks
        for a node mesh; `nodes` equal nodes of world_size/nodes ranks)."""
        n = w.world_size
        pp = self.degree(n)
        dp = n // pp
        per_node = max(n // max(w.nodes, 1), 1)
        out: dict[str, dict[str, float]] = {INTRA: {}, INTER: {}}
        d, p = self.stage_of(rank, n)
        key, one = self._boundary_send(w.layout)
        send = self.microbatches * one
        for s in range(self.total_stages(pp) - 1):  # boundary s -> s+1: forward from s's rank, backward from s+1's
            a, b = self.plan.rank_of(s, pp), self.plan.rank_of(s + 1, pp)
            if a == b:  # both stages on one rank (ZBV's turn): nothing crosses a link
                continue
            for src, dst in ((a, b), (b, a)):
                if src == p:
                    peer = d * pp + dst
                    add_bytes(out[INTER if rank // per_node != peer // per_node else INTRA], key, send)
        if dp > 1:
            group = self.replica_ranks(rank, n)
            link = INTER if len({r // per_node for r in group}) > 1 else INTRA
            add_bytes(out[link], "all_reduce:float", bus_factor("all_reduce", dp) * 4 * w.psi / pp)
        return out

    def _comm_by_link(self, w: World) -> dict[str, dict[str, float]]:
        """The world's bytes per step over its size, by link (module docstring)."""
        n = w.world_size
        total: dict[str, dict[str, float]] = {INTRA: {}, INTER: {}}
        for r in range(n):
            for link, part in self.send_bytes_of_rank(r, w).items():
                for k, v in part.items():
                    add_bytes(total[link], k, v)
        return {link: {k: v / n for k, v in part.items()} for link, part in total.items()}

    def _comm_bytes(self, w: World) -> dict[str, float]:
        out: dict[str, float] = {}
        for part in self._comm_by_link(w).values():
            for k, v in part.items():
                add_bytes(out, k, v)
        return out

    def state_bytes(self, *, psi: float, world_size: int, state: ModelState = ADAM_FP32, nodes: int = 1) -> float:
        """Psi/pp of the ZeRO figure (each rank keeps its stage's parameters, gradients and AdamW moments): exact
        for balanced stages, the embeddings and head make the first and last stages heavier. Activations of the
        micro-batches in flight (GPipe: M, 1F1B: at most pp) are not model state."""
        return (state.param_bytes + state.grad_bytes + state.optimizer_bytes) * psi / self.degree(world_size)

    # --- running ------------------------------------------------------------------------------------

    def check_layout(self, model: nn.Module, world_size: int) -> None:
        """ValueError (one line) when `model` cannot be split into this pipeline on `world_size` ranks."""
        pp = self.degree(world_size)
        bs = blocks(model)
        if not bs or not all(hasattr(model, a) for a in ("tok", "pos", "ln_f", "head")):
            raise ValueError(f"pipeline parallelism needs the gpt model (embeddings, blocks, ln_f, head); got {type(model).__name__}")
        reason = stage_split_error(len(bs), self.total_stages(pp), self.stage_layers)
        if reason:
            raise ValueError(reason)

    def _wrap(self, model: nn.Module, device: torch.device, world: World) -> nn.Module:
        import torch.distributed as dist

        from commbench.training.nets import GPTStage, PipelineRank

        n = world.world_size
        pp = self.degree(n)
        self.check_layout(model, n)
        rank = dist.get_rank()
        _, p = self.stage_of(rank, n)
        sizes = self.splits(pp, len(blocks(model)))
        starts = [sum(sizes[:s]) for s in range(len(sizes))]
        last = len(sizes) - 1
        mine = [s for s in range(len(sizes)) if self.plan.rank_of(s, pp) == p]
        stages = [(s, GPTStage(model, starts[s], starts[s] + sizes[s], first=s == 0, last=s == last,
                               wire_dtype_name=self.act_dtype_name, codec=self.codec).to(device)) for s in mine]  # fmt: skip
        # Every rank creates every group (new_group is collective), then keeps its own.
        pipe_groups = [dist.new_group(list(range(d * pp, d * pp + pp))) for d in range(n // pp)]
        dp_groups = [dist.new_group(list(range(q, n, pp))) for q in range(pp)] if n > pp else []
        return PipelineRank(stages, p, pp, self.microbatches, self.plan, pipe_groups[rank // pp], device,
                            dp_groups[p] if dp_groups else None)  # fmt: skip

    def pipeline_step(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        scale: float,
        autocast: Callable[[], Any],
        scaler: Any = None,
    ) -> torch.Tensor | None:
        """One schedule step (forward and backward of every micro-batch); returns the mean of the micro-batches'
        losses on the last stage, a zero elsewhere (`reports_loss` says which). A `scaler` multiplies the loss by its
        scale (`scaler.scale` of a one: it also initialises the scale on the stages that compute no loss, as
        `scale(loss)` would, so that every stage's `scaler.step` unscales its gradients)."""
        batch = int(x.shape[0])
        if batch % self.microbatches:  # checked on every rank before any send: all of them skip the policy
            raise ValueError(
                f"pipeline parallelism: the pipeline's batch of {batch} samples (batch_size x pp) does not split into "
                f"microbatches={self.microbatches}; valid: a divisor of {batch}"
            )
        counter = CommCounter.active()
        timing = counter.timing if counter is not None else None
        if scaler is not None:
            import torch

            scale *= float(scaler.scale(torch.ones((), device=x.device)))
        out: torch.Tensor = model.step(x, y, loss=loss, scale=scale, autocast=autocast, timed=timing is not None)  # type: ignore[operator]
        if counter is not None and timing is not None:  # the step's sends, timed one by one (p2p_timing)
            rank: Any = model
            rank.p2p.append(time_transfers(counter, rank.group, timing[0], rank.device))
        return out

    def step_profile(self, model: nn.Module, warmup: int) -> dict[str, Any]:
        """The pipeline's measured bubble beside the theory, each stage's busy and idle time, the point-to-point time
        by stage and direction (`p2p_timing.profile`; collective over the world)."""
        rank: Any = model
        counter = CommCounter.active() or CommCounter()
        theory = self.plan.theory(rank.stages, self.microbatches, self.virtual)
        return profile(rank.clock, rank.p2p, stage=rank.index, skip=warmup, theory=theory, counter=counter)


def _pp(
    name: str, schedule: str, description: str, act: str = FP32, *, autocast: bool = True, codec: str | None = None,
    scaling: LossScaling = NO_SCALING,
) -> Policy:
    """A PP policy: `act` crosses the boundaries (and, with `autocast`, is the compute dtype too; without, the stages
    compute in fp32 and only the wire is low precision), or the `codec`'s bytes do; a low-precision policy's reference
    is the fp32 one of its schedule (pp_1f1b_fp16 -> pp_1f1b_fp32)."""
    low = act != FP32 or codec is not None
    return Policy(
        name=name,
        family="pp",
        description=description,
        sharding=PipelineParallel(schedule=schedule, act_dtype_name=act, codec=codec),
        autocast_name=act if low and autocast and codec is None else None,
        loss_scaling=scaling,
        reference=name.rsplit("_", 1)[0] + "_fp32" if low else None,
    )


_GPIPE = "pipeline parallel (GPipe; pp_degree stages, data parallel over the rest)"
_1F1B = "pipeline parallel (1F1B; pp_degree stages, data parallel over the rest)"
_POLICIES = (
    _pp("pp_gpipe_fp32", GPIPE, f"{_GPIPE}, fp32; activations sent fp32"),
    _pp("pp_gpipe_bf16", GPIPE, "pipeline parallel (GPipe), autocast bf16; activations and their gradients sent bf16", BF16),
    _pp("pp_1f1b_fp32", ONE_F_ONE_B, f"{_1F1B}, fp32; activations sent fp32"),
    _pp("pp_1f1b_bf16", ONE_F_ONE_B, "pipeline parallel (1F1B), autocast bf16; activations and their gradients sent bf16", BF16),
    _pp("pp_interleaved_fp32", INTERLEAVED, "pipeline parallel (interleaved 1F1B; virtual_stages stages per rank, looped), fp32; activations sent fp32"),
    _pp("pp_interleaved_bf16", INTERLEAVED, "pipeline parallel (interleaved 1F1B), autocast bf16; activations and their gradients sent bf16", BF16),
    _pp("pp_izb_fp32", INTERLEAVED_ZB, "pipeline parallel (interleaved zero bubble: weight gradients fill the bubble), fp32"),
    _pp("pp_zbv_fp32", ZBV, "pipeline parallel (ZBV zero bubble: two stages per rank in a V), fp32"),
    _pp("pp_gpipe_bf16comm", GPIPE, "pipeline parallel (GPipe), fp32 compute; activations and their gradients sent bf16", BF16, autocast=False),
    _pp("pp_1f1b_bf16comm", ONE_F_ONE_B, "pipeline parallel (1F1B), fp32 compute; activations and their gradients sent bf16", BF16, autocast=False),
    _pp("pp_1f1b_fp16", ONE_F_ONE_B, "pipeline parallel (1F1B), autocast fp16 + ShardedGradScaler (found-inf agreed by every stage); activations and their gradients sent fp16", FP16, scaling=ShardedGradScaling()),
    _pp("pp_1f1b_fp8comm", ONE_F_ONE_B, "pipeline parallel (1F1B), fp32 compute; activations and their gradients sent as fp8 e4m3 codes + a float32 scale per token", codec="fp8_e4m3"),
)  # fmt: skip
for _p in _POLICIES:
    register_policy(_p)
