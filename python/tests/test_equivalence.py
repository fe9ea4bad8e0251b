"""Dense vs packed with quantization off: equal bit for bit (spec 4, the central
differential test), checked through the Python API, plus the packed window formula.

Lifecycles:
  * rolling — the engine's realtime configuration: fixed chunks, a sink of whole
    chunks, the window sliding over many chunks, several denoising steps per chunk;
  * eviction — chunks of varying size and a sink not aligned to chunks, so that
    eviction rolls partial chunks and the sink holds part of a chunk;
each with recent_window_tokens absent, and mixed (None, 0, small, large), and with
head-sliced writes (every head slice of a chunk written before the next chunk).
"""

from __future__ import annotations

import random

import pytest
import torch

from conftest import DTYPES, bits_equal, chunk, make_dense, make_packed


def plan_calls(kind: str, rng: random.Random, cap: int, sink: int, rw_mode: str, n_chunks: int):
    """(c, n, rw) per call, valid for both caches (n <= cap - min(sink, c))."""
    calls = []
    c = 0
    for _ in range(n_chunks):
        if kind == "rolling":
            n = cap // 4
        else:
            n = rng.choice([1, 3, 4, 5, 7, cap // 2, cap - sink])
        n = max(1, min(n, cap - min(sink, c)))
        for _ in range(rng.randint(1, 3)):
            rw = None if rw_mode == "none" else rng.choice([None, 0, 1, n, 2 * n + 1, 3 * cap])
            calls.append((c, n, rw))
        c += n
    return calls


class GlobalModel:
    """The latest value of every generated global token (what the packed cache shows)."""

    def __init__(self, B, H, D, dtype, total):
        self.k = torch.zeros(B, total, H, D, dtype=dtype)
        self.v = torch.zeros(B, total, H, D, dtype=dtype)

    def write(self, c, hs, key, value):
        n, h = key.shape[1], key.shape[2]
        self.k[:, c:c + n, hs:hs + h] = key
        self.v[:, c:c + n, hs:hs + h] = value

    def packed_view(self, ge, c, hs, h, sink, window, rw):
        se = min(sink, ge)
        tail = max(se, ge - max(0, window - se))
        lo = tail if rw is None else max(tail, c - rw)
        idx = list(range(0, se)) + list(range(lo, ge))
        return self.k[:, idx, hs:hs + h], self.v[:, idx, hs:hs + h]


def run_differential(kind, dtype, sink, rw_mode, head_slices, seed):
    B, H, D, cap = 2, 4, 8, 24
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    dense = make_dense(B, cap, H, D, dtype, sink=sink)
    packed = make_packed(B, cap, H, D, dtype, sink=sink)
    calls = plan_calls(kind, rng, cap, sink, rw_mode, n_chunks=14)
    model = GlobalModel(B, H, D, dtype, sum({c: n for c, n, _ in calls}.values()) + 1)
    slices = [(0, H)] if head_slices == 1 else [(0, H // 2), (H // 2, H // 2)]
    checked = 0
    for c, n, rw in calls:
        for hs, h in slices:
            key, value = chunk(gen, B, n, h, D, dtype), chunk(gen, B, n, h, D, dtype, scale=3.0)
            hs_arg = None if h == H else hs
            dv = dense.update_and_get_attention_kv(key=key, value=value, current_chunk_start=c,
                                                   cache_head_start=hs_arg, recent_window_tokens=rw)
            pv = packed.update_and_get_attention_kv(key=key, value=value, current_chunk_start=c,
                                                    cache_head_start=hs_arg, recent_window_tokens=rw)
            model.write(c, hs, key, value)
            assert bits_equal(dv.k, pv.k), (c, n, rw, hs)
            assert bits_equal(dv.v, pv.v), (c, n, rw, hs)
            assert (dv.visible_local_end, dv.visible_global_end) == (pv.visible_local_end, pv.visible_global_end)
            T = pv.k.shape[1]
            assert (pv.local_start_index, pv.local_end_index) == (T - n, T)
            # the dense cache wrote the chunk at local_start_index of its buffer
            assert bits_equal(dense.k[:, dv.local_start_index:dv.local_end_index, hs:hs + h], key)
            assert bits_equal(dense.v[:, dv.local_start_index:dv.local_end_index, hs:hs + h], value)
            mk, mv = model.packed_view(pv.visible_global_end, c, hs, h, sink, cap, rw)
            assert bits_equal(pv.k, mk) and bits_equal(pv.v, mv), (c, n, rw, hs)
            # cursors, as the engine exposes them
            assert int(dense.global_end_index) == int(packed.global_end_index) == pv.visible_global_end
            assert int(dense.local_end_index) == int(packed.local_end_index) == pv.visible_local_end
            checked += 1
    assert packed.resident_nbytes() > 0 and checked == len(calls) * len(slices)
    return checked


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("sink", [0, 6, 5])
@pytest.mark.parametrize("rw_mode", ["none", "mixed"])
def test_rolling_window_lifecycle_bit_exact(dtype, sink, rw_mode):
    run_differential("rolling", dtype, sink, rw_mode, head_slices=1, seed=11 + sink)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("sink", [0, 3, 7])
@pytest.mark.parametrize("rw_mode", ["none", "mixed"])
@pytest.mark.parametrize("seed", [1, 2])
def test_eviction_lifecycle_bit_exact(dtype, sink, rw_mode, seed):
    run_differential("eviction", dtype, sink, rw_mode, head_slices=1, seed=100 * seed + sink)


@pytest.mark.parametrize("rw_mode", ["none", "mixed"])
def test_head_sliced_lifecycle_bit_exact(rw_mode):
    run_differential("eviction", torch.bfloat16, 5, rw_mode, head_slices=2, seed=7)


@pytest.mark.parametrize("sink", [0, 4, 5])
def test_window_smaller_than_cache(sink):
    """window < cache_size: the packed cache shows the sink plus the newest
    window - sink_end tokens (spec 4); the dense one the last `window` buffer tokens."""
    B, H, D, cap, window, n = 1, 2, 8, 32, 16, 4
    gen = torch.Generator().manual_seed(5)
    dense = make_dense(B, cap, H, D, sink=sink, window=window)
    packed = make_packed(B, cap, H, D, sink=sink, window=window)
    assert packed.attention_window_size == window == dense.attention_window_size
    model = GlobalModel(B, H, D, torch.float32, 64)
    for c in range(0, 60, n):
        for rw in (None, 2, 0):
            key, value = chunk(gen, B, n, H, D), chunk(gen, B, n, H, D)
            model.write(c, 0, key, value)
            pv = packed.update_and_get_attention_kv(key=key, value=value, current_chunk_start=c,
                                                    recent_window_tokens=rw)
            mk, mv = model.packed_view(pv.visible_global_end, c, 0, H, sink, window, rw)
            assert bits_equal(pv.k, mk) and bits_equal(pv.v, mv)
            dv = dense.update_and_get_attention_kv(key=key, value=value, current_chunk_start=c)
            le = dv.visible_local_end
            assert bits_equal(dv.k, dense.k[:, max(0, le - window):le])
