"""Compute of a training step: FLOPs per token, GPU presets, and the time at a stated model-FLOPs utilisation.

FLOPs per token, forward and backward, are ``6*Psi + 12*L*h*s`` (Chowdhery et al. 2022, PaLM, appendix B; Narayanan
et al. 2021, eq. 3 up to the logits term): 2 FLOPs per parameter per token forward, twice that backward, plus the
attention scores and their product with the values, ``12*L*h*s`` (the ``6*L*h*s`` of the forward's QK^T and AV,
twice again backward). The time is those FLOPs over ``peak * MFU``: the MFU is an assumption the plan states and the
user sets (``--mfu``), or the step time is given (``--compute-ms``, e.g. measured by a commbench training run).
Full activation recomputation runs the forward twice: 8 of every 6 model FLOPs (MFU counts model FLOPs only, so the
time grows by 4/3 at the same hardware utilisation).

GPU presets carry the dense (no sparsity) tensor-core peaks, the memory and the node's links, each from the vendor's
datasheet (cited per preset). Link bandwidths are one direction per GPU, the figure nccl-tests' bus bandwidth
approaches (``busbw``): NVLink within a node, and the GPU's own NIC across nodes (rail-optimised DGX/HGX nodes: one
NIC per GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


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

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for compute in ``dtype`` (torch's name); ValueError when the GPU has no such peak."""
        if dtype not in self.peak_tflops:
            raise ValueError(f"{self.name} has no {dtype} peak; it has: {', '.join(self.peak_tflops)}")
        return self.peak_tflops[dtype] * 1e12


GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        # NVIDIA A100 Tensor Core GPU datasheet (2021), SXM 80GB: BF16 312, TF32 156 TFLOPS dense; 80 GB HBM2e
        # (81920 MiB); NVLink 600 GB/s (both directions); DGX A100: eight 200 Gb/s HDR NICs, one per GPU.
        GPU("a100", {"bfloat16": 312.0, "float32": 156.0}, 80 * GIB, 8, 300.0, 25.0,
            "NVIDIA A100 datasheet (SXM 80GB); DGX A100 (8x HDR 200 Gb/s)"),
        # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16 989, FP8 1979, TF32 494 TFLOPS dense (the sheet's
        # figures are with sparsity, halved here); 80 GB HBM3; NVLink 900 GB/s; DGX H100: eight 400 Gb/s NDR NICs.
        GPU("h100", {"bfloat16": 989.0, "float8": 1979.0, "float32": 494.0}, 80 * GIB, 8, 450.0, 50.0,
            "NVIDIA H100 datasheet (SXM, dense); DGX H100 (8x NDR 400 Gb/s)"),
        # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: the H100's compute (BF16 989, FP8 1979, TF32 494 dense);
        # 141 GB HBM3e; NVLink 900 GB/s; DGX H200: eight 400 Gb/s NICs.
        GPU("h200", {"bfloat16": 989.0, "float8": 1979.0, "float32": 494.0}, 141e9, 8, 450.0, 50.0,
            "NVIDIA H200 datasheet (SXM, dense); DGX H200 (8x 400 Gb/s)"),
        # NVIDIA HGX B200 / DGX B200 datasheets: per GPU BF16 2.25, FP8 4.5 PFLOPS dense, TF32 1.1 PFLOPS dense;
        # 180 GB HBM3e per GPU in HGX B200 (1.44 TB for 8); NVLink 5: 1.8 TB/s; DGX B200: eight 400 Gb/s NICs.
        GPU("b200", {"bfloat16": 2250.0, "float8": 4500.0, "float32": 1100.0}, 180e9, 8, 900.0, 50.0,
            "NVIDIA HGX/DGX B200 datasheets (dense)"),
    )
}  # fmt: skip
"""GPU preset name (the CLI's --gpu) -> its datasheet figures."""

DEFAULT_MFU = 0.40
"""The model-FLOPs utilisation assumed when none is given: about what Megatron-LM reports for GPT-3-sized models on
A100s (Narayanan et al. 2021, Table 1: 44-52 % of peak for 145B-1T) less a margin; stated in every plan."""


def flops_per_token(psi: float, layers: int, hidden: int, seq: int) -> float:
    """Model FLOPs per token, forward and backward: ``6*Psi + 12*L*h*s`` (module docstring)."""
    return 6.0 * psi + 12.0 * layers * hidden * seq


def compute_seconds(flops: float, peak_flops: float, mfu: float) -> float:
    """Seconds to run ``flops`` at ``mfu`` of ``peak_flops``."""
    return flops / (peak_flops * mfu)


__all__ = ["DEFAULT_MFU", "GPU", "GPUS", "compute_seconds", "flops_per_token"]
