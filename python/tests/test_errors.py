"""Every error of spec 5 raises the Python exception of its kind with the spec's
message, and leaves the cache exactly as it was: the next valid call behaves as
on a twin cache that never saw the bad call."""

from __future__ import annotations

import re

import pytest
import torch

from conftest import bits_equal, chunk, make_dense, make_packed, same_snapshot, snapshot
import qvg.torch as qt

# The devices a build supports (the message of a device it does not: NotImplementedError):
# the CPU, plus CUDA devices when qvg._C has its CUDA path (docs/python.md).
UNSUPPORTED_DEVICE = (r"must be a CPU or CUDA tensor \(the devices of this build of qvg.torch\)" if qt.HAS_CUDA
                      else r"must be a CPU tensor \(qvg.torch runs on the CPU in this build\)")
PACKED_DEVICES = "device must be 'cpu' or a CUDA device" if qt.HAS_CUDA else "device must be 'cpu'"

B, S, H, D = 1, 16, 4, 8
SINK = 4


def primed(kind: str, dtype=torch.float32):
    """A cache after a few chunks (sink full, eviction happened), and its twin."""
    caches = []
    for _ in range(2):
        gen = torch.Generator().manual_seed(3)
        cache = make_dense(B, S, H, D, dtype, sink=SINK) if kind == "dense" else make_packed(
            B, S, H, D, dtype, sink=SINK, quant=qt.QVGKVQuantArgs(bits=4, block_size=8, centroids=4))
        for c in range(0, 24, 4):
            x = chunk(gen, B, 4, H, D, dtype)
            cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=c)
        caches.append(cache)
    return caches


def good(dtype=torch.float32, n=4, h=H):
    gen = torch.Generator().manual_seed(9)
    return chunk(gen, B, n, h, D, dtype), chunk(gen, B, n, h, D, dtype)


# (id, exception, message regex, kwargs builder); c = 24 is the next advance for both caches.
def _k(**kw):
    key, value = good()
    base = dict(key=key, value=value, current_chunk_start=24)
    base.update(kw)
    return base


COMMON = [
    ("negative_rw", ValueError, r"^recent_window_tokens must be >= 0 or None, got -1$",
     lambda: _k(recent_window_tokens=-1)),
    ("head_slice_without_start", ValueError,
     r"^cache_head_start is required when key has 2 of the cache's 4 heads \(head slice\), got None$",
     lambda: _k(key=good(h=2)[0], value=good(h=2)[1])),
    ("head_slice_outside", ValueError, r"^cache_head_start must be in \[0, 2\] .*got 3$",
     lambda: _k(key=good(h=2)[0], value=good(h=2)[1], cache_head_start=3)),
    ("head_slice_negative", ValueError, r"^cache_head_start must be in \[0, 2\] .*got -1$",
     lambda: _k(key=good(h=2)[0], value=good(h=2)[1], cache_head_start=-1)),
    ("too_many_heads", ValueError, r"^key heads \(dim 2 of \[B, n, h, D\]\) must be in 1\.\.4, got 5",
     lambda: _k(key=torch.zeros(B, 4, 5, D), value=torch.zeros(B, 4, 5, D))),
    ("value_shape", ValueError, r"^value shape must equal key shape \[1, 4, 4, 8\], got \[1, 3, 4, 8\]$",
     lambda: _k(value=torch.zeros(B, 3, H, D))),
    ("key_dtype", ValueError, r"^key dtype must be the cache dtype f32, got bf16$",
     lambda: _k(key=good()[0].bfloat16(), value=good()[1].bfloat16())),
    ("value_dtype", ValueError, r"^value dtype must equal key dtype f32, got f16$",
     lambda: _k(value=good()[1].half())),
    ("unsupported_dtype", ValueError,
     r"^key dtype must be one of torch.float32, torch.bfloat16, torch.float16, got torch.float64$",
     lambda: _k(key=good()[0].double())),
    ("head_dim", ValueError, r"^key head_dim \(dim 3 of \[B, n, h, D\]\) must be 8, got 4",
     lambda: _k(key=torch.zeros(B, 4, H, 4), value=torch.zeros(B, 4, H, 4))),
    ("batch", ValueError, r"^key batch \(dim 0 of \[B, n, h, D\]\) must be the cache batch 1, got 2",
     lambda: _k(key=torch.zeros(2, 4, H, D), value=torch.zeros(2, 4, H, D))),
    ("not_4d", ValueError, r"^key must be a 4-D tensor \[B, n, h, D\], got shape \[4, 4, 8\]$",
     lambda: _k(key=torch.zeros(4, H, D))),
    ("n_zero", ValueError, r"^key tokens n \(dim 1 of \[B, n, h, D\]\) must be >= 1, got 0",
     lambda: _k(key=torch.zeros(B, 0, H, D), value=torch.zeros(B, 0, H, D))),
    ("negative_start", ValueError, r"^current_chunk_start must be in \[0, 2\^60\], got -4$",
     lambda: _k(current_chunk_start=-4)),
    ("nan", ValueError, r"^key must hold finite values with \|x\| <= 1e16, got nan at \[0, 2, 1, 3\]$",
     lambda: _k(key=_poison(good()[0], float("nan")))),
    ("inf", ValueError, r"^value must hold finite values with \|x\| <= 1e16, got inf at \[0, 2, 1, 3\]$",
     lambda: _k(value=_poison(good()[1], float("inf")))),
    ("out_of_limit", ValueError, r"^key must hold finite values with \|x\| <= 1e16, got 1e\+17 at \[0, 2, 1, 3\]$",
     lambda: _k(key=_poison(good()[0], 1e17))),
    ("longer_than_cache", RuntimeError, r"^chunk of n = 17 tokens is longer than the cache \(cache_size = 16\)$",
     lambda: _k(key=torch.zeros(B, 17, H, D), value=torch.zeros(B, 17, H, D))),
    ("overwrites_sink", RuntimeError, r"^chunk \[24, 37\) would overwrite sink tokens: .*cache_size - sink = 12",
     lambda: _k(key=torch.zeros(B, 13, H, D), value=torch.zeros(B, 13, H, D))),
    # A device this build does not support: NotImplementedError (spec 5: the device row).
    ("non_cpu_key", NotImplementedError, rf"^key {UNSUPPORTED_DEVICE}, got device meta$",
     lambda: _k(key=torch.zeros(B, 4, H, D, device="meta"))),
]

DENSE_ONLY = [
    ("rewrite_evicted", RuntimeError, r"^rewrite of evicted positions: current_chunk_start = 4 maps to buffer index -4",
     lambda: _k(current_chunk_start=4)),
]

PACKED_ONLY = [
    ("current_chunk_size_change", NotImplementedError,
     r"^rewrite of the current chunk \[20, 24\) must keep its size: n must be 4, got 3",
     lambda: _k(current_chunk_start=20, key=torch.zeros(B, 3, H, D), value=torch.zeros(B, 3, H, D))),
    ("non_sequential", NotImplementedError,
     r"^non-sequential write: current_chunk_start must be the current chunk's start 20 \(rewrite\) or "
     r"global_end = 24 \(advance\), got 16$",
     lambda: _k(current_chunk_start=16)),
    ("gap", NotImplementedError, r"^non-sequential write: .*got 28$", lambda: _k(current_chunk_start=28)),
]


def _poison(t: torch.Tensor, x: float) -> torch.Tensor:
    t = t.clone()
    t[0, 2, 1, 3] = x
    return t


def check_error_leaves_cache_unchanged(kind, exc, pattern, build):
    cache, twin = primed(kind)
    prev_view = cache.update_and_get_attention_kv(key=good()[0], value=good()[1], current_chunk_start=20)
    twin.update_and_get_attention_kv(key=good()[0], value=good()[1], current_chunk_start=20)
    kept = (prev_view.k.clone(), prev_view.v.clone())
    before = snapshot(cache)
    with pytest.raises(exc) as info:
        cache.update_and_get_attention_kv(**build())
    assert type(info.value) is exc
    assert re.search(pattern, str(info.value)), str(info.value)
    assert same_snapshot(snapshot(cache), before)
    assert bits_equal(prev_view.k, kept[0]) and bits_equal(prev_view.v, kept[1])
    # The next valid calls behave as if the bad one never happened.
    gen = torch.Generator().manual_seed(21)
    for c in (24, 24, 28):
        x = chunk(gen, B, 4, H, D)
        a = cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=c, recent_window_tokens=6)
        b = twin.update_and_get_attention_kv(key=x, value=x, current_chunk_start=c, recent_window_tokens=6)
        assert bits_equal(a.k, b.k) and bits_equal(a.v, b.v)
        assert (a.local_start_index, a.visible_global_end) == (b.local_start_index, b.visible_global_end)
    assert same_snapshot(snapshot(cache), snapshot(twin))


@pytest.mark.parametrize("case", COMMON + DENSE_ONLY, ids=lambda c: c[0])
def test_dense_errors(case):
    _, exc, pattern, build = case
    check_error_leaves_cache_unchanged("dense", exc, pattern, build)


@pytest.mark.parametrize("case", COMMON + PACKED_ONLY, ids=lambda c: c[0])
def test_packed_errors(case):
    _, exc, pattern, build = case
    check_error_leaves_cache_unchanged("packed", exc, pattern, build)


def test_chunk_longer_than_window():
    for cache in (make_dense(B, S, H, D, window=8), make_packed(B, S, H, D, window=8)):
        before = snapshot(cache)
        with pytest.raises(RuntimeError, match="longer than the attention window|is not entirely visible"):
            cache.update_and_get_attention_kv(key=torch.zeros(B, 9, H, D), value=torch.zeros(B, 9, H, D),
                                              current_chunk_start=0)
        assert same_snapshot(snapshot(cache), before)
    # packed: the window minus the sink in front of the chunk
    cache = make_packed(B, S, H, D, sink=4, window=8)
    cache.update_and_get_attention_kv(key=torch.zeros(B, 4, H, D), value=torch.zeros(B, 4, H, D),
                                      current_chunk_start=0)
    with pytest.raises(RuntimeError, match=r"^chunk \[4, 9\) is not entirely visible: .*got n = 5$"):
        cache.update_and_get_attention_kv(key=torch.zeros(B, 5, H, D), value=torch.zeros(B, 5, H, D),
                                          current_chunk_start=4)


@pytest.mark.parametrize("kind", ["dense", "packed"])
def test_constructor_errors(kind):
    def build(**kw):
        if kind == "dense":
            return make_dense(B, S, H, D, **kw)
        return make_packed(B, S, H, D, **kw)

    with pytest.raises(ValueError, match=r"^sink_tokens must be in \[0, cache_size = 16\], got 17$"):
        build(sink=17)
    with pytest.raises(ValueError, match=r"^attention_window_size must be in \[1, cache_size = 16\] or None, got 17$"):
        build(window=17)


def test_packed_constructor_errors():
    base = dict(batch_size=1, cache_size=16, num_heads=2, head_dim=8, dtype=torch.float32, device="cpu",
                global_end_index=torch.zeros(1, dtype=torch.long), local_end_index=torch.zeros(1, dtype=torch.long),
                quant_args=qt.QVGKVQuantArgs())
    with pytest.raises(NotImplementedError, match=r"^allow_growth must be false for the packed cache"):
        qt.QVGPackedCausalKVCache(**base, allow_growth=True)
    with pytest.raises(NotImplementedError, match=PACKED_DEVICES + ", got 'meta'"):
        qt.QVGPackedCausalKVCache(**{**base, "device": "meta"})
    with pytest.raises(ValueError, match=r"^dtype must be one of .* got torch.float64$"):
        qt.QVGPackedCausalKVCache(**{**base, "dtype": torch.float64})
    with pytest.raises(ValueError, match=r"^block_size must divide head_dim \(8\), got block_size=64$"):
        qt.QVGPackedCausalKVCache(**{**base, "quant_args": qt.QVGKVQuantArgs(bits=4)})
    with pytest.raises(ValueError, match=r"^centroids must be in 1\.\.256, got 0$"):
        qt.QVGPackedCausalKVCache(**{**base, "quant_args": qt.QVGKVQuantArgs(bits=4, block_size=8, centroids=0)})
    with pytest.raises(ValueError, match=r"^num_heads must be >= 1, got 0$"):
        qt.QVGPackedCausalKVCache(**{**base, "num_heads": 0})


def test_dense_constructor_errors():
    idx = dict(global_end_index=torch.zeros(1, dtype=torch.long), local_end_index=torch.zeros(1, dtype=torch.long))
    k = torch.zeros(1, 16, 2, 8)
    with pytest.raises(ValueError, match=r"^cache_size must be 0 or k.shape\[1\] = 16"):
        qt.CausalSelfAttentionKVCache(k=k, v=k.clone(), cache_size=8, **idx)
    with pytest.raises(ValueError, match=r"^v shape must equal k shape \[1, 16, 2, 8\], got \[1, 8, 2, 8\]$"):
        qt.CausalSelfAttentionKVCache(k=k, v=torch.zeros(1, 8, 2, 8), **idx)
    with pytest.raises(ValueError, match=r"^k must be contiguous"):
        qt.CausalSelfAttentionKVCache(k=k.transpose(1, 2), v=k.clone().transpose(1, 2), **idx)
    with pytest.raises(NotImplementedError, match=rf"^k {UNSUPPORTED_DEVICE}, got device meta$"):
        qt.CausalSelfAttentionKVCache(k=k.to("meta"), v=k.to("meta"), **idx)
    with pytest.raises(ValueError, match=r"^k dtype must be one of"):
        qt.CausalSelfAttentionKVCache(k=k.double(), v=k.double(), **idx)


def test_failed_growth_changes_nothing():
    cache = make_dense(1, 8, 2, 8, growth=True)
    x = torch.ones(1, 4, 2, 8)
    cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=0)
    cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=4)
    k_before = cache.k
    before = snapshot(cache)
    bad = x.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        cache.update_and_get_attention_kv(key=bad, value=x, current_chunk_start=8)
    assert cache.k is k_before and cache.cache_size == 8 and same_snapshot(snapshot(cache), before)


def test_snapshot_detects_changes():
    """The unchanged-state checks above can fail: any valid call changes the snapshot."""
    for kind in ("dense", "packed"):
        cache, _ = primed(kind)
        before = snapshot(cache)
        cache.update_and_get_attention_kv(key=good()[0], value=good()[1], current_chunk_start=20)
        assert not same_snapshot(snapshot(cache), before)


def test_dense_buffers_resized_in_place_are_refused():
    cache = make_dense(1, 8, 2, 8)
    cache.k.resize_(1, 64, 2, 8)  # reallocates the caller's tensor under the cache
    with pytest.raises(ValueError, match=r"^the cache's k/v tensors must keep their storage and shape \[1, 8, 2, 8\]"):
        cache.update_and_get_attention_kv(key=torch.zeros(1, 4, 2, 8), value=torch.zeros(1, 4, 2, 8),
                                          current_chunk_start=0)
