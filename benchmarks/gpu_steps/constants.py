"""What the steps run: the grid, the sizes, the timing flags, the training suite, and the one error a step without CUDA raises."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


REPO = Path(__file__).resolve().parents[2]
"""The repository root (this file is benchmarks/gpu_steps/constants.py)."""


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
PRECISIONS = (
    "fp32", "fp16", "bf16", "fp16_compress", "bf16_compress",
    "fp8_e4m3", "fp8_e4m3:block128", "fp8_e4m3:none", "fp8_e5m2", "fp8_e5m2:block32", "fp8_e5m2:none",
    "fp8_e4m3_native", "fp8_e5m2_native",
)  # fmt: skip
NATIVE_PRECISIONS = ("fp8_e4m3_native", "fp8_e5m2_native", "fp8_e4m3_native:block128")
MIB = 2**20
BIG_BYTES = 256 * MIB
"""The one large point of the sweep, the hook's bucket and the codec throughput tensor (fp32 bytes)."""
FAST_TIMING = ("--warmup", "1", "--min-time", "0.001", "--min-iters", "2", "--repeats", "3", "--passes", "1",
               "--max-time", "0.5", "--target-ci", "0.5")  # fmt: skip
"""Timing flags that measure little: the sweep steps are about correctness on CUDA, not about the figures."""
SWEEP_SIZES = ("4K", "1M", "256")
"""-b, -e, -f of the small sweep: 4K and 1M."""
BIG_SWEEP_SIZES = ("256M", "256M", "2")
"""-b, -e, -f of the large sweep: the one 256M point."""
HOOK_CODECS = ("fp8_e4m3", "fp8_e5m2:block128")
"""Scaled codecs: codes and scales travel as two buffers, the case that raced on NCCL."""
CODEC_CASES = tuple((fmt, scaling) for fmt in ("e4m3", "e5m2") for scaling in ("tensor", "block", "none"))
CODEC_BLOCK = 128
MIN_COPY_FRACTION = 0.3
"""Encode + decode's work (5 + 5 bytes per element) over the copy's bandwidth, at least."""
MIN_BANDWIDTH_FRACTION = 0.5
"""The bytes the codec path really moves, at least this fraction of the copy's bandwidth (issue 34)."""
CLI_GRACE_S = 9.0
"""Seconds of a step's limit kept back from a CLI run it starts, to stop that run and still write the record."""

GPT_TABLE = """\
model = "gpt"
batch_size = 8
seq_len = 64
d_model = 128
n_layers = 2
n_heads = 4
vocab = 512
measure_memory = true
"""
"""The small GPT every training run of the check uses (the [training] table's model part)."""
TRAINING_TOML = (
    'name = "gpu-check-training"\ncollectives = []\n\n[training]\n'
    + GPT_TABLE
    + 'policies = "all"\nsteps = 2\nwarmup_steps = 1\ncomm_timed_steps = 1\n'
)


class NoCuda(RuntimeError):
    """No CUDA device visible to torch: the check cannot test anything."""
