"""Shared helpers for the qvg.torch suite: cache factories, chunk data, snapshots.

Run with the interpreter torch belongs to, after building the extension:
    PYTHONPATH=build/python/python /usr/bin/python3 -m pytest python/tests
"""

from __future__ import annotations

import pytest
import torch

import qvg.torch as qt

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
_INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def index_tensor(value: int = 0) -> torch.Tensor:
    return torch.full((1,), value, dtype=torch.long)


def make_dense(B=1, S=16, H=2, D=8, dtype=torch.float32, *, sink=0, window=0, ints=False, growth=False,
               fill=0.0):
    k = torch.full((B, S, H, D), fill, dtype=dtype)
    v = torch.full((B, S, H, D), fill, dtype=dtype)
    return qt.CausalSelfAttentionKVCache(
        k=k, v=v, global_end_index=index_tensor(), local_end_index=index_tensor(),
        global_end_index_int=0 if ints else None, local_end_index_int=0 if ints else None,
        cache_size=S, sink_tokens=sink, attention_window_size=window, allow_growth=growth,
    )


def make_packed(B=1, S=16, H=2, D=8, dtype=torch.float32, *, sink=0, window=None, ints=False, quant=None):
    return qt.QVGPackedCausalKVCache(
        batch_size=B, cache_size=S, num_heads=H, head_dim=D, dtype=dtype, device="cpu",
        global_end_index=index_tensor(), local_end_index=index_tensor(), use_int_indices=ints,
        sink_tokens=sink, attention_window_size=window,
        quant_args=quant if quant is not None else qt.QVGKVQuantArgs(),
    )


def chunk(gen: torch.Generator, B, n, h, D, dtype=torch.float32, scale=1.0):
    """A [B, n, h, D] chunk of normal values (exactly representable in dtype)."""
    return (torch.randn(B, n, h, D, generator=gen) * scale).to(dtype)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (shape, dtype and every bit pattern)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    iv = _INT_VIEW[a.dtype]
    return torch.equal(a.contiguous().view(iv), b.contiguous().view(iv))


def snapshot(cache) -> tuple:
    """Everything observable about a cache: the C++ state (buffers, segments,
    cursors, byte counts, scratch) plus the Python cursors and index tensors."""
    return (
        cache._c.debug_state(),
        cache.global_end_index_int,
        cache.local_end_index_int,
        cache.global_end_index.clone(),
        cache.local_end_index.clone(),
        cache.resident_nbytes(),
        cache.peak_transient_nbytes(),
    )


def same_snapshot(a: tuple, b: tuple) -> bool:
    return (a[0] == b[0] and a[1:3] == b[1:3] and torch.equal(a[3], b[3]) and torch.equal(a[4], b[4])
            and a[5:] == b[5:])


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)
