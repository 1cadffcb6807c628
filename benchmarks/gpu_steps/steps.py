"""The steps themselves: each asserts on what it ran and puts its figures into its report."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

from gpu_steps.checks import check_native, check_sweep, check_training, expected_pairs, layout_skips
from gpu_steps.codec import CodecResult, codec_exact_cases, copy_fraction, time_cuda
from gpu_steps.constants import (
    BIG_BYTES,
    BIG_SWEEP_SIZES,
    CLI_GRACE_S,
    CODEC_BLOCK,
    CODEC_CASES,
    COLLECTIVES,
    HOOK_CODECS,
    MIN_BANDWIDTH_FRACTION,
    MIN_COPY_FRACTION,
    NATIVE_PRECISIONS,
    PRECISIONS,
    SWEEP_SIZES,
    TRAINING_TOML,
)
from gpu_steps.hook import hook_control, hook_vs_sync
from gpu_steps.report import StepReport, size_text
from gpu_steps.runs import Context, cuda_device, fresh_dir, group_skips, native_args, run_cli, run_suite, sweep_args

if TYPE_CHECKING:
    pass


def step_device(ctx: Context, rep: StepReport) -> None:
    import torch
    import torch.distributed as dist

    from commbench.measure import fp8

    dev = cuda_device()
    props = torch.cuda.get_device_properties(dev)
    rep.fig("gpu", props.name)
    rep.fig("capability", f"{props.major}.{props.minor}")
    rep.fig("memory_gib", props.total_memory / 2**30)
    rep.fig("devices", torch.cuda.device_count())
    rep.fig("torch", torch.__version__)
    rep.fig("cuda", torch.version.cuda)
    rep.check(dist.is_available() and dist.is_nccl_available(), "torch.distributed has no NCCL backend")
    try:
        v = torch.cuda.nccl.version()
        rep.fig("nccl", ".".join(map(str, v)) if isinstance(v, tuple) else str(v))
    except (RuntimeError, AttributeError) as e:
        rep.fail(f"torch.cuda.nccl.version() failed: {e}")
    rep.fig("fp8_codec", fp8.codec_info(dev))
    rep.fig("cpu_codec", fp8.kernel_status())
    rep.fig("python", sys.version.split()[0])
    rep.fig("cpus", os.cpu_count())
    f = rep.figures
    print(
        f"{f['gpu']} (sm_{props.major}{props.minor}, {f['memory_gib']:.0f} GiB, {f['devices']} device(s)); "
        f"torch {f['torch']}, CUDA {f['cuda']}, NCCL {f.get('nccl', '?')}; fp8 codec on CUDA: {f['fp8_codec']}"
    )


def _sweep(
    ctx: Context, rep: StepReport, name: str, sizes: tuple[str, str, str], extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> None:  # fmt: skip
    from commbench.core.units import parse_size, size_grid
    from commbench.store.results import load, load_metadata

    cuda_device()
    run = fresh_dir(ctx.out / name / "run")
    lo, hi, factor = sizes
    args = sweep_args(run, lo, hi, factor, extra)
    cli = run_cli(args, ctx.out / name / "console.log", ctx.left_s() - CLI_GRACE_S, env)
    rep.fig("cli_rc", cli.rc)
    rep.check(cli.rc == 0, f"`commbench run` exited with status {cli.rc} (see {name}/console.log)")
    try:
        df, meta = load(run), load_metadata(run)
    except Exception as e:  # noqa: BLE001 - a missing or broken run directory is this step's finding
        rep.fail(f"cannot read the run directory: {e}")
        return
    rep.fig("device", meta.get("device_name") or meta.get("device"))
    rep.fig("fp8_codec", meta.get("fp8_codec"))
    grid = size_grid(parse_size(lo), parse_size(hi), int(factor))
    group_skips(rep, df, cli.console)
    check_sweep(rep, df, expected_pairs(COLLECTIVES, PRECISIONS, "nccl"), grid, "nccl")
    big = df[df["fp32_bytes"] == max(grid)] if len(df) else df
    for prec in ("fp32", "fp8_e4m3"):
        row = big[(big["collective"] == "all_reduce") & (big["precision"] == prec)]
        if len(row):
            rep.fig(f"all_reduce {prec} {size_text(max(grid))} total_us", float(row["total_us"].iloc[0]))


def step_sweep(ctx: Context, rep: StepReport) -> None:
    # the grid's collectives on NCCL with the eager codec (every fp8 point through the vectorised path): no compile
    # in this first run; codec_exact compiles the fused graphs next (inductor's on-disk cache), which sweep_256m
    # and the later steps then load
    from commbench.measure import fused

    _sweep(ctx, rep, "sweep", SWEEP_SIZES, env={fused.ENV: "0"})


def step_sweep_256m(ctx: Context, rep: StepReport) -> None:
    # CUDA events time this one (--device-timer events); the small sweep keeps the host clock
    _sweep(ctx, rep, "sweep_256m", BIG_SWEEP_SIZES, ("--device-timer", "events"))


def step_native(ctx: Context, rep: StepReport) -> None:
    from commbench.store.results import load, load_metadata

    cuda_device()
    run = fresh_dir(ctx.out / "native" / "run")
    args = native_args(run)
    cli = run_cli(args, ctx.out / "native" / "console.log", ctx.left_s() - CLI_GRACE_S)
    rep.fig("cli_rc", cli.rc)
    rep.check(
        cli.rc == 0, f"`commbench run` of native fp8 exited with status {cli.rc}: a failed probe must skip, not abort"
    )
    try:
        meta = load_metadata(run)
        df = load(run)
    except Exception as e:  # noqa: BLE001
        rep.fail(f"cannot read the run directory: {e}")
        return
    group_skips(rep, df, cli.console)
    check_native(rep, df, meta, cli.console, NATIVE_PRECISIONS)
    rep.fig("nccl_debug_logs", len(list((run / "logs").glob("nccl*"))) if (run / "logs").is_dir() else 0)
    native = df[df["impl"] == "fp8_native"] if len(df) else df
    if len(native):
        bad = native[native["wrong"].isna() | (native["wrong"] != 0)]
        for _, row in bad.iterrows():
            rep.fail(
                f"{row['collective']} x {row['precision']} at {size_text(row['fp32_bytes'])}: #wrong = {row['wrong']}"
            )


def step_hook(ctx: Context, rep: StepReport) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    dev = cuda_device()
    torch.cuda.set_device(dev)
    store = fresh_dir(ctx.out / "hook") / "rendezvous"
    store.parent.mkdir(parents=True, exist_ok=True)
    dist.init_process_group(
        "nccl", init_method=f"file://{store}", rank=0, world_size=1,
        timeout=datetime.timedelta(seconds=max(30.0, ctx.left_s())), device_id=dev,
    )  # fmt: skip
    try:
        numel = BIG_BYTES // 4
        rep.fig("bucket_fp32_bytes", BIG_BYTES)
        for name in HOOK_CODECS:
            t0 = time.monotonic()
            found = hook_vs_sync(name, numel, dev)
            torch.cuda.synchronize()
            rep.fig(f"{name} s", time.monotonic() - t0)
            rep.fig(f"{name} differing elements", sum(found.values()))
            for where, bad in found.items():
                rep.check(
                    bad == 0,
                    f"{name} {where}: {bad} of {numel} elements differ from the synchronous chunked all_reduce",
                )
        hook_control(rep, HOOK_CODECS[0], numel, dev)
    finally:
        dist.destroy_process_group()


def step_codec_exact(ctx: Context, rep: StepReport) -> None:
    import torch

    from commbench.measure import fp8

    dev = cuda_device()
    cpu = torch.device("cpu")
    rep.fig("cpu_path", fp8.kernel_status())
    rep.fig("cuda_path", fp8.codec_info(dev))

    def plain(thunk: Callable[[], CodecResult]) -> CodecResult:
        return thunk()

    codec_exact_cases(rep, plain, plain, cpu, dev, ("CPU", "CUDA"))


def step_codec_speed(ctx: Context, rep: StepReport) -> None:
    import torch

    from commbench.measure import fp8, fused

    dev = cuda_device()
    # 77 past 2**26: a short last block, as codec_exact's inputs, so the step reuses their compiled graphs
    n = BIG_BYTES // 4 + 77
    x = torch.randn(n, device=dev)
    y = torch.empty_like(x)
    q = torch.empty(n, dtype=torch.uint8, device=dev)
    copy_s, _ = time_cuda(lambda: y.copy_(x))
    rep.fig("tensor_fp32_bytes", 4 * n)
    rep.fig("copy_gbps", 8 * n / copy_s / 1e9)
    for fmt, scaling in CODEC_CASES:
        s = torch.empty(fp8.num_scales(n, scaling, CODEC_BLOCK), dtype=torch.float32, device=dev)
        encode = partial(fp8.quantize, x, fmt, scaling, CODEC_BLOCK, out=(q, s))
        decode = partial(fp8.dequantize, q, s, fmt, scaling, CODEC_BLOCK, out=y)
        enc_s, enc_first = time_cuda(encode)
        dec_s, dec_first = time_cuda(decode)
        enc_b, dec_b = (sum(fused.moved_bytes(fn)) / n for fn in (encode, decode))  # what the code path moves
        f = copy_fraction(enc_s, dec_s, copy_s, n, moved=(enc_b, dec_b))
        label = f"{fmt} {scaling}"
        shown = {k: round(v, 3) for k, v in f.items() if k != "copy_gbps"}
        rep.fig(label, {**shown, "first_calls_s": round(enc_first + dec_first, 3)})
        rep.check(
            f["fraction"] >= MIN_COPY_FRACTION,
            f"{label}: encode + decode at {f['encode_decode_gbps']:.0f} GB/s is {f['fraction']:.2f} of the device copy "
            f"({f['copy_gbps']:.0f} GB/s), below {MIN_COPY_FRACTION}",
        )
        rep.check(
            f["bandwidth_fraction"] >= MIN_BANDWIDTH_FRACTION,
            f"{label}: the {f['moved_b_per_element']:.1f} B per element encode + decode move run at "
            f"{f['bandwidth_fraction']:.2f} of the copy's bandwidth, below {MIN_BANDWIDTH_FRACTION}",
        )


def step_training(ctx: Context, rep: StepReport) -> None:
    from commbench.store.results import load_training
    from commbench.training.policies import get_policy, list_policies

    dev = cuda_device()
    run, cli = run_suite(ctx, "training", TRAINING_TOML, ctx.left_s() - CLI_GRACE_S)
    rep.fig("cli_rc", cli.rc)
    rep.check(
        cli.rc == 0, f"`commbench run` of the training suite exited with status {cli.rc} (see training/console.log)"
    )
    try:
        df = load_training(run)
    except Exception as e:  # noqa: BLE001
        rep.fail(f"cannot read the run directory: {e}")
        return
    skips = layout_skips(TRAINING_TOML, world_size=1)
    # what this machine cannot run (the GPU image's torch may come without torchao), asked of each policy's sharding
    # as the runner asks it: those have their one-line skip instead, listed, not failed
    refused = {p: get_policy(p).sharding.environment_error(dev) for p in list_policies() if p not in skips}
    refused = {p: why for p, why in refused.items() if why}
    rep.fig("policies_skipped_by_environment", refused)
    check_training(rep, df, list_policies(), "cuda_allocator", {**skips, **refused})
