"""Ring attention (training/ring_attention.py) against full causal attention in float64: the same code run on a
ring of threads in one process, every member's output chunk and its gradients (dQ, dK, dV of its chunk) equal to
torch's own SDPA with is_causal=True on the unsplit sequence, differentiated by autograd; the per-layer element
count against the hand-worked figure."""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from commbench.training.ring_attention import ThreadRing, ring_attention, ring_elements


def _threaded(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, go: torch.Tensor, cp: int, wire: torch.dtype
) -> list[Any]:
    """Each of `cp` threads: its chunk's output and the gradients of <out, go> for its chunk of q, k, v."""
    qs, ks, vs, gs = (t.chunk(cp, dim=2) for t in (q, k, v, go))
    queues: list[queue.Queue[torch.Tensor]] = [queue.Queue() for _ in range(cp)]
    res: list[Any] = [None] * cp

    def member(i: int) -> None:
        qi, ki, vi = (t[i].detach().clone().requires_grad_() for t in (qs, ks, vs))
        out = ring_attention(qi, ki, vi, ThreadRing(queues, i), wire)
        (out * gs[i]).sum().backward()
        res[i] = (out.detach(), qi.grad, ki.grad, vi.grad)

    threads = [threading.Thread(target=member, args=(i,)) for i in range(cp)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    return res


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_ring_equals_full_causal_attention_float64(cp: int) -> None:
    g = torch.Generator().manual_seed(cp)
    b, h, s, d = 2, 3, 12, 5
    q, k, v, go = (torch.randn(b, h, s, d, dtype=torch.float64, generator=g) for _ in range(4))
    ref_q, ref_k, ref_v = (t.clone().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(ref_q, ref_k, ref_v, is_causal=True)
    (ref * go).sum().backward()
    got = _threaded(q, k, v, go, cp, torch.float64)
    for i, (out, dq, dk, dv) in enumerate(got):
        sl = slice(i * s // cp, (i + 1) * s // cp)
        for name, a, want in (
            ("out", out, ref),
            ("dq", dq, ref_q.grad),
            ("dk", dk, ref_k.grad),
            ("dv", dv, ref_v.grad),
        ):
            assert want is not None
            torch.testing.assert_close(a, want[:, :, sl].detach(), rtol=1e-10, atol=1e-12, msg=f"{name} chunk {i}")


def test_ring_bf16_wire_is_close_not_exact() -> None:
    """The wire cast is real: bf16 K/V on the ring moves the output (by bf16's relative error), fp32 does not."""
    g = torch.Generator().manual_seed(7)
    q, k, v, go = (torch.randn(1, 2, 8, 4, generator=g) for _ in range(4))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    low = torch.cat([r[0] for r in _threaded(q, k, v, go, 2, torch.bfloat16)], dim=2)
    full = torch.cat([r[0] for r in _threaded(q, k, v, go, 2, torch.float32)], dim=2)
    torch.testing.assert_close(full, ref, rtol=1e-5, atol=1e-6)
    err = (low - ref).abs().max().item()
    assert 0 < err < 3e-2


def test_ring_elements_per_layer() -> None:
    # cp=2: forward one [K; V] exchange (2n); backward one [K; V; dK; dV] (4n) and the [dK; dV] home (2n)
    assert ring_elements(2, 10) == (20, 60)
    assert ring_elements(4, 10) == (60, 140)  # 3 x 2n; 3 x 4n + 2n
