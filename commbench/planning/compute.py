"""Compute of a training step: FLOPs per token, GPU presets (peaks, memory, links, kernel efficiency), and the time
of a number of FLOPs at a fraction of peak.

FLOPs per token, forward and backward, are ``6*Psi + 12*L*h*s`` (Chowdhery et al. 2022, PaLM, appendix B; Narayanan
et al. 2021, eq. 3 up to the logits term): 2 FLOPs per parameter per token forward, twice that backward, plus the
attention scores and their product with the values, ``12*L*h*s`` (the ``6*L*h*s`` of the forward's QK^T and AV,
twice again backward). The per-layer count the layout model uses (attention projections with grouped-query heads,
the MLP's width and kind, the logits) is :mod:`commbench.planning.flops`.

Two fractions of peak, never mixed (issue 32): a GPU's **kernel efficiency** is what its matrix multiplies reach
(compute time = FLOPs / (peak x kernel efficiency)); the step time then adds what no compute hides (bubble, exposed
communication, optimizer, stage imbalance). **MFU** is an *output*: model FLOPs per step over (step time x peak x
GPUs). A user's ``--mfu`` is end-to-end: the step time is FLOPs / (peak x MFU) and nothing is added to it.

GPU presets carry the dense (no sparsity) tensor-core peaks, the memory and the node's links, each from the vendor's
datasheet (cited per preset). Link bandwidths are one direction per GPU, the figure nccl-tests' bus bandwidth
approaches (``busbw``): NVLink within a node, and the GPU's own NIC across nodes (rail-optimised DGX/HGX nodes: one
NIC per GPU).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GPU:
    """A GPU as the plan uses it."""

    name: str
    peak_tflops: dict[str, float]
    """Dense tensor-core peak by compute dtype (torch's name: bfloat16, float32 = TF32, float8)."""
    memory_bytes: float
    gpus_per_node: int
    nvlink_gbps: float
    """NVLink bandwidth per GPU per direction, GB/s (1e9 bytes/s)."""
    network_gbps: float
    """Network bandwidth per GPU per direction across nodes, GB/s."""
    source: str
    hbm_gbps: float = 2000.0
    """HBM bandwidth, GB/s (the optimizer step is memory-bound)."""
    kernel_efficiency: tuple[float, float, float] = (0.5, 0.6, 0.7)
    """(low, default, high) fraction of the dense peak the step's matrix multiplies reach: the default is the one
    constant calibrated per GPU kind (on one named published row, :data:`CALIBRATION`); low/high are the interval's
    ends."""

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for compute in ``dtype`` (torch's name); ValueError when the GPU has no such peak."""
        if dtype not in self.peak_tflops:
            raise ValueError(f"{self.name} has no {dtype} peak; it has: {', '.join(self.peak_tflops)}")
        return self.peak_tflops[dtype] * 1e12


KERNEL_EFFICIENCY: dict[str, tuple[float, float, float]] = {
    "a100": (0.57, 0.67, 0.77),
    "h100": (0.53, 0.63, 0.73),
    "h200": (0.53, 0.63, 0.73),
    "b200": (0.45, 0.55, 0.65),
}
"""(low, default, high) kernel efficiency per GPU kind; the default is calibrated on the row :data:`CALIBRATION`
names (benchmarks/bench_plan_published.py, every other published row held out), the range is the interval's
(+-0.10 of peak: what GEMM shapes of one model size vary by). tests/test_published_runs.py keeps each default within
0.01 of what the calibration solves for now."""
KERNEL_RANGE = 0.10
"""Half-width of the kernel-efficiency interval (of peak): the presets' and a given ``--kernel-efficiency``'s."""
CALIBRATION: dict[str, str] = {
    "a100": "calibrated on Narayanan et al. 2021's GPT-3 175B PTD-P run on 384 A100s (0.674)",
    "h100": "calibrated on Megatron-Core r0.8.0's GPT-3 177B run on 2304 H100s, TP and DP communication overlapped "
            "(0.625)",
    "h200": "the H100's (same tensor cores), not calibrated on an H200 run",
    "b200": "a first estimate below the H100's, not calibrated on a B200 run",
}
"""Where each GPU kind's default kernel efficiency comes from (the published row it was calibrated on)."""

GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        # NVIDIA A100 Tensor Core GPU datasheet (2021), SXM 80GB: BF16 312, TF32 156 TFLOPS dense; 80 GB HBM2e
        # (81920 MiB; taken as the 80e9 bytes it is labelled, the rest is headroom); HBM 2039 GB/s; NVLink 600 GB/s (both
        # directions); DGX A100: eight 200 Gb/s HDR NICs, one per GPU.
        GPU("a100", {"bfloat16": 312.0, "float32": 156.0}, 80e9, 8, 300.0, 25.0,
            "NVIDIA A100 datasheet (SXM 80GB); DGX A100 (8x HDR 200 Gb/s)", 2039.0, KERNEL_EFFICIENCY["a100"]),
        # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16 989, FP8 1979, TF32 494 TFLOPS dense (the sheet's
        # figures are with sparsity, halved here); 80 GB HBM3 (80e9 bytes as labelled), 3.35 TB/s; NVLink 900 GB/s; DGX H100:
        # eight 400 Gb/s NDR NICs.
        GPU("h100", {"bfloat16": 989.0, "float8": 1979.0, "float32": 494.0}, 80e9, 8, 450.0, 50.0,
            "NVIDIA H100 datasheet (SXM, dense); DGX H100 (8x NDR 400 Gb/s)", 3350.0, KERNEL_EFFICIENCY["h100"]),
        # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: the H100's compute (BF16 989, FP8 1979, TF32 494 dense);
        # 141 GB HBM3e, 4.8 TB/s; NVLink 900 GB/s; DGX H200: eight 400 Gb/s NICs.
        GPU("h200", {"bfloat16": 989.0, "float8": 1979.0, "float32": 494.0}, 141e9, 8, 450.0, 50.0,
            "NVIDIA H200 datasheet (SXM, dense); DGX H200 (8x 400 Gb/s)", 4800.0, KERNEL_EFFICIENCY["h200"]),
        # NVIDIA HGX B200 / DGX B200 datasheets: per GPU BF16 2.25, FP8 4.5 PFLOPS dense, TF32 1.1 PFLOPS dense;
        # 180 GB HBM3e per GPU in HGX B200 (1.44 TB for 8), 8 TB/s; NVLink 5: 1.8 TB/s; DGX B200: eight 400 Gb/s NICs.
        GPU("b200", {"bfloat16": 2250.0, "float8": 4500.0, "float32": 1100.0}, 180e9, 8, 900.0, 50.0,
            "NVIDIA HGX/DGX B200 datasheets (dense)", 8000.0, KERNEL_EFFICIENCY["b200"]),
    )
}  # fmt: skip
"""GPU preset name (the CLI's --gpu) -> its datasheet figures."""

def flops_per_token(psi: float, layers: int, hidden: int, seq: int) -> float:
    """Model FLOPs per token, forward and backward: ``6*Psi + 12*L*h*s`` (module docstring)."""
    return 6.0 * psi + 12.0 * layers * hidden * seq


def check_fp8(g: GPU, fp8_gemms: bool, fp8_param_gather: bool) -> None:
    """ValueError (one line) for FP8 on a GPU without FP8 tensor cores (naming its peaks), or FP8 weights without
    FP8 GEMMs (Transformer Engine's FP8 weights feed its FP8 GEMMs only)."""
    if fp8_param_gather and not fp8_gemms:
        raise ValueError("--fp8-param-gather needs --fp8-gemms: FP8 weights are Transformer Engine's, for its FP8 GEMMs")
    if fp8_gemms:
        g.peak("float8")


__all__ = ["CALIBRATION", "GPU", "GPUS", "KERNEL_EFFICIENCY", "KERNEL_RANGE", "check_fp8", "flops_per_token"]
