"""`commbench plan`: its arguments and its handler (one layout or option list, or the 3-D search)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from commbench.cli.common import CLIError, csv_list, positive_float, positive_int, size


def add_plan_parser(sub: Any) -> None:
    """The ``plan`` sub-parser."""
    pl = sub.add_parser("plan", help="capacity plan: memory, bytes and predicted time per strategy x precision, or a 3-D search over GPU counts")
    pl.add_argument("run_dir", type=Path, nargs="?", metavar="RUN_DIR", help="fit a cost model to this run directory")
    pl.add_argument("--model", type=Path, help="cost model JSON from `commbench fit`")
    pl.add_argument("--params", type=positive_float, help="parameters, Psi (e.g. 7e9); default: the model preset's")
    pl.add_argument("--model-preset", help="published model shape: llama2-7b | llama3-8b | llama3-70b | gpt3-175b")
    pl.add_argument("--nodes", type=positive_int, default=1, help="nodes (default 1)")
    pl.add_argument("--gpus-per-node", type=positive_int, default=8, help="ranks per node (default 8)")
    pl.add_argument("--gpus", type=csv_list, help="3-D search over these GPU counts, e.g. 64,128,256 (TP x PP x DP)")
    pl.add_argument("--target-tokens-per-s", type=positive_float, help="3-D search: the fewest GPUs reaching this")
    pl.add_argument("--train-tokens", type=positive_float, help="3-D search target: tokens to train on (with --days)")
    pl.add_argument("--days", type=positive_float, help="3-D search target: days to train --train-tokens in")
    pl.add_argument("--gpu", help="GPU preset: a100 | h100 | h200 | b200 (memory, peak, links; search default h100)")
    pl.add_argument("--strategies", type=csv_list, help="comma-separated, default all: ddp,zero1,zero1_torch,zero2,zero3,fsdp,hsdp")
    pl.add_argument("--precisions", type=csv_list, help="comma-separated, default all: fp32,bf16,fp8 (search: bf16,fp8)")
    pl.add_argument("--optimizer", default="adam", help="adam | sgd (default adam)")
    pl.add_argument("--layers", type=positive_int, help="transformer layers (overrides the preset's)")
    pl.add_argument("--hidden", type=positive_int, help="hidden size h (overrides the preset's)")
    pl.add_argument("--heads", type=positive_int, help="attention heads a (overrides the preset's)")
    pl.add_argument("--kv-heads", type=positive_int, help="key/value heads (default: heads)")
    pl.add_argument("--ffn", type=positive_int, help="MLP hidden size (overrides the preset's)")
    pl.add_argument("--vocab", type=positive_int, help="vocabulary size (overrides the preset's)")
    pl.add_argument("--seq", type=positive_int, help="sequence length s (overrides the preset's; tokens)")
    pl.add_argument("--micro-batch", type=positive_int, help="micro-batch b per rank (activations, tokens; default 1 with a model)")
    pl.add_argument("--global-batch-tokens", type=size, help="3-D search: tokens per optimizer step (default 4M)")
    pl.add_argument("--attention", default="flash", help="flash (default: no s^2 scores) | eager")
    pl.add_argument("--recompute", default=None, help="none | selective | full (default none; search: selective)")
    pl.add_argument("--device-memory", type=size, help="memory per device (80G; 1024-based; default: the GPU preset's)")
    pl.add_argument("--compute-ms", type=positive_float, help="compute time per step and rank, ms (e.g. measured)")
    pl.add_argument("--tflops", type=positive_float, help="device peak TFLOP/s (with --mfu; default: the GPU preset's)")
    pl.add_argument("--mfu", type=positive_float, help="model flops utilisation, 0..1 (search default 0.40)")
    pl.add_argument("--overlap", type=float, default=None, help="one fraction of compute all comm hides behind (default: per strategy)")
    pl.add_argument("--out", type=Path, required=True, help="output directory (plan.csv, plan.md, plan.html)")


def cmd_plan(args: argparse.Namespace, argv: list[str]) -> int:
    from commbench.planning.options import PRECISIONS, STRATEGIES
    from commbench.planning.plan import plan
    from commbench.planning.plan_render import format_plan, write_plan

    if args.model is not None and args.run_dir is not None:
        raise CLIError("give either --model model.json or a RUN_DIR, not both")
    if args.run_dir is not None:
        from commbench.store.results import load_metadata

        load_metadata(args.run_dir)
    model = args.model if args.model is not None else args.run_dir
    shape = {"layers": args.layers, "hidden": args.hidden, "heads": args.heads, "kv_heads": args.kv_heads,
             "ffn": args.ffn, "vocab": args.vocab, "seq": args.seq}  # fmt: skip
    if (args.train_tokens is None) != (args.days is None):
        raise CLIError("--train-tokens and --days go together (target tokens/s = tokens / (days * 86400))")
    if args.train_tokens is not None:
        if args.target_tokens_per_s is not None:
            raise CLIError("give either --target-tokens-per-s or --train-tokens with --days, not both")
        args.target_tokens_per_s = args.train_tokens / (args.days * 86400.0)
    if args.gpus is not None or args.target_tokens_per_s is not None:
        return _cmd_search(args, model, shape)
    for flag, v in (("--global-batch-tokens", args.global_batch_tokens),):
        if v is not None:
            raise CLIError(f"{flag} belongs to the 3-D search: give --gpus or --target-tokens-per-s with it")
    df = plan(
        params=args.params,
        model_preset=args.model_preset,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        strategies=args.strategies or list(STRATEGIES),
        precisions=args.precisions or list(PRECISIONS),
        optimizer=args.optimizer,
        micro_batch=args.micro_batch,
        attention=args.attention,
        recompute=args.recompute or "none",
        gpu=args.gpu,
        device_memory=args.device_memory,
        compute_ms=args.compute_ms,
        tflops=args.tflops,
        mfu=args.mfu,
        overlap=args.overlap,
        model=model,
        **shape,
    )
    paths = write_plan(df, args.out, df.attrs.get("device_memory", args.device_memory))
    print(format_plan(df))
    for k, v in df.attrs.get("skipped", {}).items():
        print(f"# not an option: {k}: {v}")
    for kind in ("csv", "md", "html"):
        print(f"{kind}: {paths[kind]}")
    return 0


def _cmd_search(args: argparse.Namespace, model: Path | None, shape: dict[str, int | None]) -> int:
    """``plan --gpus`` / ``--target-tokens-per-s``: the 3-D search (commbench.planning.search)."""
    from commbench.planning.plan_render import format_search, write_search
    from commbench.planning.search import search

    for flag, v in (("--params", args.params), ("--compute-ms", args.compute_ms), ("--tflops", args.tflops),
                    ("--overlap", args.overlap)):  # fmt: skip
        if v is not None:
            raise CLIError(f"{flag} is not used by the 3-D search (it takes the model preset, --gpu and --mfu)")
    gpus = None
    if args.gpus is not None:
        try:
            gpus = [int(x) for x in args.gpus]
        except ValueError:
            raise CLIError(f"--gpus takes integers, e.g. 64,128,256; got {','.join(args.gpus)}") from None
    opts: dict[str, object] = {}
    if args.strategies:
        opts["strategies"] = args.strategies
    if args.precisions:
        opts["precisions"] = args.precisions
    if args.mfu is not None:
        opts["mfu"] = args.mfu
    if args.micro_batch is not None:
        opts["micro_batch"] = args.micro_batch
    if args.global_batch_tokens is not None:
        opts["global_batch_tokens"] = args.global_batch_tokens
    if args.recompute is not None:
        opts["recompute"] = args.recompute
    df = search(
        model_preset=args.model_preset, gpus=gpus, target_tokens_per_s=args.target_tokens_per_s,
        gpu=args.gpu or "h100", optimizer=args.optimizer, attention=args.attention,
        device_memory=args.device_memory, model=model, **opts, **shape,  # type: ignore[arg-type]
    )  # fmt: skip
    paths = write_search(df, args.out)
    print(format_search(df))
    for kind in ("csv", "md", "html"):
        print(f"{kind}: {paths[kind]}")
    return 0
