"""`commbench plan`: its arguments and its handler (one layout or option list, or the 3-D search)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from commbench.cli.common import CLIError, csv_list, positive_float, positive_int, size


def int_list(text: str) -> list[int]:
    """``8`` or ``1,2,4,8``: positive integers."""
    return [positive_int(t) for t in csv_list(text)]


LAYOUT_FLAGS = ("tp", "pp", "dp", "cp", "vpp", "global_batch", "pp_split")
"""Flags that make a plan price one given layout (without --gpus / a target)."""
LAYOUT_KINDS = ("sequence_parallel", "tp_comm_overlap", "overlap_param_gather", "fp8_gemms", "fp8_param_gather")
"""Switches of how a layout runs: priced by the fixed layout and the search, meaningless to the flat plan."""


def add_plan_parser(sub: Any) -> None:
    """The ``plan`` sub-parser."""
    pl = sub.add_parser("plan", help="capacity plan: memory, bytes and predicted time per strategy x precision, one given layout (--tp/--pp/--dp), or a search over GPU counts")
    # "-7e9" is a (negative) number, not an option: its one-line error names the value (argparse's own matcher
    # knows no exponents)
    pl._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
    pl.add_argument("run_dir", type=Path, nargs="?", metavar="RUN_DIR", help="fit a cost model to this run directory")
    pl.add_argument("--model", type=Path, help="cost model JSON from `commbench fit`")
    pl.add_argument("--replay", type=Path, metavar="DIR", help="a `commbench replay` folder: the job's own calls as the layout's communication (docs/replay.md)")
    pl.add_argument("--params", type=positive_float, help="parameters, Psi (e.g. 7e9); default: the model preset's")
    pl.add_argument("--model-preset", help="published model shape: llama2-7b | llama3-8b | llama3-70b | gpt3-175b")
    pl.add_argument("--nodes", type=positive_int, help="nodes (default 1; a layout: what it needs)")
    pl.add_argument("--gpus-per-node", type=positive_int, help="ranks per node (default 8: the GPU preset's)")
    pl.add_argument("--gpus", type=csv_list, help="3-D search over these GPU counts, e.g. 64,128,256 (TP x PP x DP)")
    pl.add_argument("--target-tokens-per-s", type=positive_float, help="3-D search: the fewest GPUs reaching this")
    pl.add_argument("--train-tokens", type=positive_float, help="3-D search target: tokens to train on (with --days)")
    pl.add_argument("--days", type=positive_float, help="3-D search target: days to train --train-tokens in")
    pl.add_argument("--gpu", help="GPU preset: a100 | h100 | h200 | b200 (memory, peak, links; search default h100)")
    pl.add_argument("--strategies", "--strategy", type=csv_list, help="comma-separated, default all: ddp,zero1,zero1_torch,zero2,zero3,fsdp,hsdp")
    pl.add_argument("--precisions", "--precision", type=csv_list, help="comma-separated, default all: fp32,bf16,fp8 (search: bf16,fp8)")
    pl.add_argument("--optimizer", default="adam", help="adam | sgd (default adam)")
    pl.add_argument("--layers", type=positive_int, help="transformer layers (overrides the preset's)")
    pl.add_argument("--hidden", type=positive_int, help="hidden size h (overrides the preset's)")
    pl.add_argument("--heads", type=positive_int, help="attention heads a (overrides the preset's)")
    pl.add_argument("--kv-heads", type=positive_int, help="key/value heads (default: heads)")
    pl.add_argument("--ffn", type=positive_int, help="MLP hidden size (overrides the preset's)")
    pl.add_argument("--vocab", type=positive_int, help="vocabulary size (overrides the preset's)")
    pl.add_argument("--seq", type=positive_int, help="sequence length s (overrides the preset's; tokens)")
    pl.add_argument("--mlp", choices=("swiglu", "gelu"), help="MLP kind (default: the preset's; a given shape: swiglu)")
    pl.add_argument("--norm", choices=("rmsnorm", "layernorm"), help="norm kind (default: the preset's; rmsnorm)")
    pl.add_argument("--biases", action="store_true", default=None, help="count the Linear layers' biases")
    pl.add_argument("--tied-embeddings", action="store_true", default=None, help="output layer tied to the embedding")
    pl.add_argument("--micro-batch", type=int_list, help="sequences per micro-batch (default 1; search: a list)")
    pl.add_argument("--global-batch", type=positive_int, help="sequences per optimizer step (a layout, the search)")
    pl.add_argument("--global-batch-tokens", type=size, help="tokens per optimizer step (default 4M), rounded to sequences")
    pl.add_argument("--tp", type=int_list, help="tensor-parallel degree: one layout (with --pp/--dp), or the search's list")
    pl.add_argument("--pp", type=int_list, help="pipeline stages (any <= layers; uneven splits balanced)")
    pl.add_argument("--dp", type=positive_int, help="data-parallel degree (default: GPUs / (tp*pp*cp))")
    pl.add_argument("--cp", type=int_list, help="context-parallel degree (default 1)")
    pl.add_argument("--vpp", type=int_list, help="virtual stages per pipeline stage (interleaved 1F1B; default 1)")
    pl.add_argument("--sequence-parallel", action="store_true", help="sequence parallelism with TP (Megatron's flag; a layout)")
    pl.add_argument("--tp-comm-overlap", action="store_true", help="TP collectives pipelined with the matmuls (Megatron's flag; a layout or the search)")
    pl.add_argument("--overlap-param-gather", action="store_true", help="ZeRO-1/2's parameter gather during the next forward (Megatron-Core's flag; a layout or the search)")
    pl.add_argument("--fp8-gemms", action="store_true", help="FP8 linear layers (Transformer Engine): the GEMMs at the FP8 peak (a layout or the search)")
    pl.add_argument("--fp8-param-gather", action="store_true", help="with --fp8-gemms: weights held and all-gathered in FP8, 1 byte each (Megatron-Core's flag, NeMo's fp8_params; a layout or the search)")
    pl.add_argument("--cp-comm", default="ring", help="ring (default: Megatron's, hidden) | all_gather (Llama 3's, exposed)")
    pl.add_argument("--pp-split", help="layers per pipeline stage, e.g. 13,12,12,11 (default: balanced)")
    pl.add_argument("--kernel-efficiency", type=positive_float, help="fraction of peak the matmuls reach (default: the GPU preset's)")
    pl.add_argument("--headroom", type=float, default=None, help="fraction of device memory kept free (default 0.10)")
    pl.add_argument("--attention", default="flash", help="flash (default: no s^2 scores) | eager")
    pl.add_argument("--recompute", default=None, help="none | selective | full (default none; search: selective)")
    pl.add_argument("--device-memory", type=size, help="memory per device (80G; 1024-based; default: the GPU preset's)")
    pl.add_argument("--compute-ms", type=positive_float, help="compute time per step and rank, ms (e.g. measured)")
    pl.add_argument("--tflops", type=positive_float, help="device peak TFLOP/s (with --mfu; default: the GPU preset's)")
    pl.add_argument("--mfu", type=positive_float, help="END-TO-END model flops utilisation, 0..1: the step is the FLOPs at it, nothing is added (default: kernel efficiency + exposed overheads)")
    pl.add_argument("--overlap", type=float, default=None, help="one fraction of compute all comm hides behind (default: per strategy)")
    pl.add_argument("--out", type=Path, required=True, help="output directory (plan.csv, plan.md, plan.html)")


def _kinds(args: argparse.Namespace) -> dict[str, object]:
    """The model kinds as the shape's fields (None: the preset's)."""
    return {
        "gated_mlp": None if args.mlp is None else args.mlp == "swiglu",
        "norm_params": None if args.norm is None else (1 if args.norm == "rmsnorm" else 2),
        "biases": args.biases, "tied_embeddings": args.tied_embeddings,
    }  # fmt: skip


def _one(flag: str, v: list[int] | None, default: int) -> int:
    if v is None:
        return default
    if len(v) != 1:
        raise CLIError(f"--{flag} takes one value for one layout (a list is for the search: add --gpus)")
    return v[0]


def cmd_plan(args: argparse.Namespace, argv: list[str]) -> int:
    if args.model is not None and args.run_dir is not None:
        raise CLIError("give either --model model.json or a RUN_DIR, not both")
    if args.run_dir is not None:
        from commbench.store.results import load_metadata

        load_metadata(args.run_dir)
    model = args.model if args.model is not None else args.run_dir
    shape = {"layers": args.layers, "hidden": args.hidden, "heads": args.heads, "kv_heads": args.kv_heads,
             "ffn": args.ffn, "vocab": args.vocab, "seq": args.seq, **_kinds(args)}  # fmt: skip
    if args.headroom is not None and not 0 <= args.headroom < 1:
        raise CLIError(f"--headroom must be a fraction in [0, 1), got {args.headroom:g}")
    if (args.train_tokens is None) != (args.days is None):
        raise CLIError("--train-tokens and --days go together (target tokens/s = tokens / (days * 86400))")
    if args.train_tokens is not None:
        if args.target_tokens_per_s is not None:
            raise CLIError("give either --target-tokens-per-s or --train-tokens with --days, not both")
        args.target_tokens_per_s = args.train_tokens / (args.days * 86400.0)
    if args.replay is not None and (args.gpus is not None or args.target_tokens_per_s is not None):
        raise CLIError("--replay prices one layout (--tp/--pp/--dp/--cp), not the search (--gpus, a target)")
    if args.gpus is not None or args.target_tokens_per_s is not None:
        return _cmd_search(args, model, shape)
    if args.replay is not None or any(getattr(args, f) is not None for f in LAYOUT_FLAGS):
        return _cmd_layout(args, model, shape)
    return _cmd_flat(args, model, shape)


def _cmd_layout(args: argparse.Namespace, model: Path | None, shape: dict[str, object]) -> int:
    """``plan --tp T --pp P --dp D ...``: exactly one layout (commbench.planning.layout_plan)."""
    import sys

    from commbench.planning import replay_comm
    from commbench.planning.layout_plan import plan_layout
    from commbench.planning.layout_render import format_layout, write_layout

    extra: dict[str, object] = {}
    if args.headroom is not None:
        extra["headroom"] = args.headroom
    replayed = None if args.replay is None else replay_comm.load_replay(args.replay)
    df = plan_layout(
        model_preset=args.model_preset, params=args.params, tp=_one("tp", args.tp, 1), pp=_one("pp", args.pp, 1),
        dp=args.dp, cp=_one("cp", args.cp, 1), vpp=_one("vpp", args.vpp, 1),
        micro_batch=_one("micro-batch", args.micro_batch, 1), global_batch=args.global_batch,
        global_batch_tokens=args.global_batch_tokens, recompute=args.recompute or "none", pp_split=args.pp_split,
        sequence_parallel=args.sequence_parallel, tp_comm_overlap=args.tp_comm_overlap,
        fp8_gemms=args.fp8_gemms, fp8_param_gather=args.fp8_param_gather, cp_comm=args.cp_comm,
        overlap_param_gather=args.overlap_param_gather,
        gpu=args.gpu or "h100", nodes=args.nodes, gpus_per_node=args.gpus_per_node,
        strategies=args.strategies or ["ddp"], precisions=args.precisions or ["bf16"], optimizer=args.optimizer,
        attention=args.attention, kernel_efficiency=args.kernel_efficiency, compute_ms=args.compute_ms,
        mfu=args.mfu, tflops=args.tflops, overlap=args.overlap, device_memory=args.device_memory, model=model,
        **extra, **shape,  # type: ignore[arg-type]
    )  # fmt: skip
    if replayed is not None:
        r = df.iloc[0]
        rows = replay_comm.price(replayed, tp=int(r["tp"]), pp=int(r["pp"]), dp=int(r["dp"]), cp=int(r["cp"]),
                                 precisions=list(dict.fromkeys(df["precision"])))  # fmt: skip
    paths = write_layout(df, args.out)
    print(format_layout(df))
    if replayed is not None:
        replay_comm.write_rows(args.out / "plan_replay.csv", rows)
        own = {str(p): float(c) for p, c in zip(df["precision"][::-1], df["comm_total_s"][::-1], strict=True)}  # the first row's
        for line in replay_comm.summary(rows, replayed, f"TP {r['tp']} x PP {r['pp']} x DP {r['dp']} x CP {r['cp']}", own):
            print(f"# {line}")
        print(f"replay: {args.out / 'plan_replay.csv'}")
    for kind in ("csv", "md", "html"):
        print(f"{kind}: {paths[kind]}")
    if df.attrs.get("would_fit"):
        print(f"commbench: {df.attrs['would_fit']}", file=sys.stderr)
        return 1
    return 0


def _cmd_flat(args: argparse.Namespace, model: Path | None, shape: dict[str, object]) -> int:
    """The plan of strategies x precisions over all ranks (commbench.planning.plan)."""
    import sys

    from commbench.planning.options import PRECISIONS, STRATEGIES
    from commbench.planning.plan import plan
    from commbench.planning.plan_render import format_plan, write_plan

    if args.global_batch_tokens is not None:
        raise CLIError("--global-batch-tokens belongs to a layout (--tp/--pp/--dp) or the search (--gpus)")
    for name in LAYOUT_KINDS:
        if getattr(args, name):
            flag = "--" + name.replace("_", "-")
            raise CLIError(f"{flag} describes how a layout runs: give the layout (--tp/--pp/--dp) or search (--gpus)")
    if args.cp_comm != "ring":
        raise CLIError("--cp-comm describes how a layout runs: give the layout (--tp/--pp/--dp --cp) or search (--gpus)")
    extra: dict[str, object] = {}
    if args.headroom is not None:
        extra["headroom"] = args.headroom
    df = plan(
        params=args.params, model_preset=args.model_preset, nodes=args.nodes or 1,
        gpus_per_node=args.gpus_per_node or 8, strategies=args.strategies or list(STRATEGIES),
        precisions=args.precisions or list(PRECISIONS), optimizer=args.optimizer,
        micro_batch=_one("micro-batch", args.micro_batch, 1) if args.micro_batch else None, attention=args.attention,
        recompute=args.recompute or "none", gpu=args.gpu, device_memory=args.device_memory,
        compute_ms=args.compute_ms, tflops=args.tflops, mfu=args.mfu, overlap=args.overlap, model=model,
        kernel_efficiency=args.kernel_efficiency, **extra, **shape,  # type: ignore[arg-type]
    )  # fmt: skip
    paths = write_plan(df, args.out, df.attrs.get("device_memory", args.device_memory))
    print(format_plan(df))
    for k, v in df.attrs.get("skipped", {}).items():
        print(f"# not an option: {k}: {v}")
    for kind in ("csv", "md", "html"):
        print(f"{kind}: {paths[kind]}")
    if not df.empty and (df["fits"] == False).all():  # noqa: E712 - None (no device memory) is not False
        r = df.loc[df["mem_total_bytes"].astype(float).idxmin()]
        print(f"commbench: no option fits: the least memory, {r['strategy']} {r['precision']}, needs "
              f"{r['mem_total_bytes'] / 1e9:.1f} GB per GPU; would fit with fewer bytes per GPU: more --nodes "
              "(sharded strategies), --recompute full or a smaller --micro-batch", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _cmd_search(args: argparse.Namespace, model: Path | None, shape: dict[str, object]) -> int:
    """``plan --gpus`` / ``--target-tokens-per-s``: the search over layouts (commbench.planning.search)."""
    from commbench.planning.plan_render import format_search, write_search
    from commbench.planning.search import search

    for flag, v in (("--params", args.params), ("--compute-ms", args.compute_ms), ("--dp", args.dp),
                    ("--pp-split", args.pp_split)):  # fmt: skip
        if v is not None:
            raise CLIError(f"{flag} is not used by the search (it derives DP and balances the stages per layout)")
    gpus = None
    if args.gpus is not None:
        try:
            gpus = [int(x) for x in args.gpus]
        except ValueError:
            raise CLIError(f"--gpus takes integers, e.g. 64,128,256; got {','.join(args.gpus)}") from None
    opts: dict[str, object] = {}
    for name in ("strategies", "precisions", "mfu", "micro_batch", "global_batch", "global_batch_tokens", "recompute",
                 "tp", "pp", "cp", "vpp", "kernel_efficiency", "tflops", "overlap", "headroom", "gpus_per_node"):
        v = getattr(args, name)
        if v is not None:
            opts[name] = v
    for name in LAYOUT_KINDS:
        if name != "sequence_parallel":  # the search assumes sequence parallelism with TP
            opts[name] = bool(getattr(args, name))
    opts["cp_comm"] = args.cp_comm
    df = search(
        model_preset=args.model_preset, gpus=gpus, target_tokens_per_s=args.target_tokens_per_s,
        gpu=args.gpu or "h100", optimizer=args.optimizer, attention=args.attention,
        device_memory=args.device_memory, model=model, **opts, **shape,  # type: ignore[arg-type]
    )  # fmt: skip
    paths = write_search(df, args.out)
    print(format_search(df))
    for kind in ("csv", "md", "html"):
        print(f"{kind}: {paths[kind]}")
    if not (df["ruled_out"] == "").any():
        import sys

        print(f"commbench: {df.attrs.get('answer', 'no option fits')}; more GPUs (--gpus), --recompute full or a "
              "smaller --micro-batch would need less memory per GPU", file=sys.stderr)  # fmt: skip
        return 1
    return 0
