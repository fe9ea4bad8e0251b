"""What the multi-rank tests (test_distributed.py) and their rank processes
(dist_worker.py) share: the scenario, its inputs and the attention they compare."""

from __future__ import annotations

import math

import torch

import qvg.torch as qt

B, H, D = 1, 8, 32
CHUNK = 24  # tokens of a chunk; each of N ranks holds CHUNK / N of them
CHUNKS = 6
STEPS = 2  # per chunk: the advance, then one rewrite (a denoising step)
CACHE = 4 * CHUNK
SINK = CHUNK
DTYPE = torch.bfloat16
QUANTS = {"off": None, "int2": dict(bits=2, centroids=8, block_size=16)}


def quant_args(name: str) -> qt.QVGKVQuantArgs:
    q = QUANTS[name]
    return qt.QVGKVQuantArgs(**q) if q else qt.QVGKVQuantArgs()


def steps():
    """(current_chunk_start, step) of every call of the scenario."""
    return [(c * CHUNK, s) for c in range(CHUNKS) for s in range(STEPS)]


def qkv(start: int, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole chunk's q, k, v [B, CHUNK, H, D] of one call (deterministic)."""
    g = torch.Generator().manual_seed(1000 + 7 * start + step)
    x = torch.randn(3, B, CHUNK, H, D, generator=g)
    # Per-head offsets, as real K/V have, so that k-means has structure to find.
    x = x + torch.linspace(-4, 4, H).view(1, 1, 1, H, 1)
    q, k, v = (t.to(DTYPE) for t in x)
    return q, k, v


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Per-head attention of q [B, n, h, D] over k, v [B, T, h, D], fp32 inside: each
    head's result depends on that head's inputs only (the same operations whatever h)."""
    outs = []
    for h in range(q.shape[2]):
        qh, kh, vh = (t[:, :, h].float() for t in (q, k, v))
        p = torch.softmax(torch.matmul(qh, kh.transpose(1, 2)) / math.sqrt(q.shape[3]), dim=-1)
        outs.append(torch.matmul(p, vh).to(q.dtype))
    return torch.stack(outs, dim=2)


def single_process(quant: str) -> tuple[list[torch.Tensor], int]:
    """The reference: one cache of all H heads, the whole chunk per call. Returns the
    attention output [B, CHUNK, H, D] of every call and the final resident bytes."""
    cache = qt.QVGPackedCausalKVCache(
        batch_size=B, cache_size=CACHE, num_heads=H, head_dim=D, dtype=DTYPE, device="cpu",
        global_end_index=torch.zeros(1, dtype=torch.long), local_end_index=torch.zeros(1, dtype=torch.long),
        sink_tokens=SINK, quant_args=quant_args(quant))
    outs = []
    for start, step in steps():
        q, k, v = qkv(start, step)
        view = cache.update_and_get_attention_kv(key=k, value=v, current_chunk_start=start)
        outs.append(attention(q, view.k, view.v))
    return outs, cache.resident_nbytes()
