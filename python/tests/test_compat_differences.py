"""Each deliberate difference from the engine's cache classes, pinned (docs/compat.md,
one test per row, named after it). Both sides run the same call; the test states
what the engine does and what qvg does.
"""

from __future__ import annotations

import pytest
import torch

import qvg.torch as qt
from compat_common import ENGINE_KVCACHE, ENGINE_PACKED, ENGINE_QUANT, import_engine
from conftest import bits_equal, index_tensor, same_snapshot, snapshot

eng_dense_mod = import_engine(ENGINE_KVCACHE)
eng_packed_mod = import_engine(ENGINE_PACKED)
eng_quant_mod = import_engine(ENGINE_QUANT)


def dense(which: str, S=8, H=2, D=4, sink=0, window=0):
    cls = eng_dense_mod.CausalSelfAttentionKVCache if which == "engine" else qt.CausalSelfAttentionKVCache
    return cls(k=torch.zeros(1, S, H, D), v=torch.zeros(1, S, H, D), global_end_index=index_tensor(),
               local_end_index=index_tensor(), cache_size=S, sink_tokens=sink, attention_window_size=window)


def packed(which: str, S=8, H=2, D=4, sink=0, window=None):
    if which == "engine":
        cls, q = eng_packed_mod.QVGPackedCausalKVCache, eng_quant_mod.QVGKVQuantArgs()
    else:
        cls, q = qt.QVGPackedCausalKVCache, qt.QVGKVQuantArgs()
    return cls(batch_size=1, cache_size=S, num_heads=H, head_dim=D, dtype=torch.float32, device=torch.device("cpu"),
               global_end_index=index_tensor(), local_end_index=index_tensor(), sink_tokens=sink,
               attention_window_size=window, quant_args=q)


def chunk(n, H=2, D=4, fill=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, n, H, D, generator=g) if fill is None else torch.full((1, n, H, D), float(fill))
    return x


def call(cache, key, c, hs=None, rw=None, value=None):
    return cache.update_and_get_attention_kv(key=key, value=key if value is None else value, current_chunk_start=c,
                                             cache_head_start=hs, recent_window_tokens=rw)


# ---- dense -----------------------------------------------------------------------


def test_dense_validates_before_mutating():
    """Engine: an advance with recent_window_tokens = -1 rolls and writes the buffer,
    then raises ValueError. qvg: ValueError and nothing changed."""
    e, q = dense("engine", sink=2), dense("qvg", sink=2)
    for c in (e, q):
        call(c, chunk(4, fill=1), 0)
        call(c, chunk(4, fill=2), 4)
    before_e = e.k.clone()
    before_q = snapshot(q)
    with pytest.raises(ValueError):
        call(e, chunk(4, fill=3), 8, rw=-1)
    with pytest.raises(ValueError):
        call(q, chunk(4, fill=3), 8, rw=-1)
    assert not torch.equal(e.k, before_e)  # the engine wrote the chunk before raising
    assert same_snapshot(snapshot(q), before_q)


def test_dense_sink_overwrite_refused():
    """Engine: a chunk that after eviction lands on sink slots overwrites them silently.
    qvg: RuntimeError ('would overwrite sink tokens')."""
    e, q = dense("engine", S=8, sink=4), dense("qvg", S=8, sink=4)
    for c in (e, q):
        call(c, chunk(4, fill=1), 0)
        call(c, chunk(4, fill=2), 4)
    call(e, chunk(6, fill=3), 8)
    assert torch.all(e.k[:, 2:4] == 3)  # sink tokens 2, 3 overwritten
    with pytest.raises(RuntimeError, match="overwrite sink tokens"):
        call(q, chunk(6, fill=3), 8)


def test_dense_rewrite_into_sink_refused():
    """Engine: after eviction, a rewrite of a global position whose buffer index falls in
    the sink slots writes there. qvg: RuntimeError ('rewrite of evicted positions')."""
    e, q = dense("engine", S=8, sink=2), dense("qvg", S=8, sink=2)
    for c in (e, q):
        for g in range(0, 12, 4):
            call(c, chunk(4, fill=g), g)
    # evicted = 4: global 5 maps to buffer index 1, a sink slot
    call(e, chunk(1, fill=9), 5)
    assert torch.all(e.k[:, 1] == 9)
    with pytest.raises(RuntimeError, match="evicted"):
        call(q, chunk(1, fill=9), 5)


def test_dense_chunk_beyond_window_refused():
    """Engine: a chunk longer than attention_window_size is accepted and only partly
    visible. qvg: RuntimeError (the current chunk must be entirely visible)."""
    e, q = dense("engine", S=8, window=3), dense("qvg", S=8, window=3)
    view = call(e, chunk(4), 0)
    assert view.k.shape[1] == 3
    with pytest.raises(RuntimeError, match="attention window"):
        call(q, chunk(4), 0)


def test_dense_head_sliced_roll_moves_every_head():
    """Engine: an advance with cache_head_start that evicts rolls only the written heads,
    so the other heads' older tokens shift out of step with the written ones. qvg: rolls
    every head (global position g >= sink at buffer index g - evicted for all heads)."""
    H = 4
    e, q = dense("engine", S=8, H=H), dense("qvg", S=8, H=H)
    for c in (e, q):
        for g in (0, 4):
            call(c, chunk(4, H=H, fill=g + 1), g)
        call(c, chunk(2, H=2, fill=7), 8, hs=0)  # evicts 2: tokens 2..7 move to 0..5
    assert torch.all(q.k[:, 0:2] == 1) and torch.all(q.k[:, 2:6] == 5)  # every head rolled
    assert torch.all(e.k[:, 0:2, :2] == 1) and torch.all(e.k[:, 0:2, 2:] == 1)
    assert torch.all(e.k[:, 2:4, 2:] == 1)  # heads 2, 3 not rolled: tokens 2, 3 still at 2, 3
    assert torch.all(q.k[:, 2:4, 2:] == 5)


def test_dense_error_precedence():
    """A call with two faults: the engine checks the placement first (RuntimeError),
    qvg the arguments first (ValueError)."""
    e, q = dense("engine", S=8), dense("qvg", S=8)
    with pytest.raises(RuntimeError):
        call(e, chunk(10), 0, rw=-1)
    with pytest.raises(ValueError):
        call(q, chunk(10), 0, rw=-1)


@pytest.mark.parametrize("case", ["head_slice_out_of_range", "head_dim", "negative_start"])
def test_dense_invalid_arguments_are_value_errors(case):
    """Engine: torch's shape-mismatch RuntimeError from the slice assignment (or its
    write-range RuntimeError). qvg: ValueError naming the argument (spec 5)."""
    e, q = dense("engine", H=4), dense("qvg", H=4)
    key, c, hs = {
        "head_slice_out_of_range": (chunk(2, H=2), 0, 3),
        "head_dim": (chunk(2, H=4, D=8), 0, None),
        "negative_start": (chunk(2, H=4), -2, None),
    }[case]
    with pytest.raises(RuntimeError):
        call(e, key, c, hs=hs)
    with pytest.raises(ValueError):
        call(q, key, c, hs=hs)


@pytest.mark.parametrize("case", ["empty_chunk", "dtype", "value_shape", "nan", "cache_head_start_with_all_heads"])
def test_dense_inputs_engine_accepts_qvg_refuses(case):
    """Engine: accepts (casts the dtype, broadcasts a value of another shape, stores NaN,
    ignores cache_head_start when all heads are given, returns an empty chunk). qvg:
    ValueError (spec 5)."""
    e, q = dense("engine", H=4), dense("qvg", H=4)
    k4 = chunk(2, H=4)
    kw = {
        "empty_chunk": dict(key=k4[:, :0], c=0),
        "dtype": dict(key=k4.double(), c=0),
        "value_shape": dict(key=k4, value=k4[:, :1], c=0),
        "nan": dict(key=k4 * float("nan"), c=0),
        "cache_head_start_with_all_heads": dict(key=k4, c=0, hs=1),
    }[case]
    call(e, **kw)
    with pytest.raises(ValueError):
        call(q, **kw)


def test_dense_pinned_sink_not_supported():
    """Engine: global_sink_tokens and pin_current_chunk (longlive2's pinned sink).
    qvg: accepted only as no-ops (global_sink_tokens = 0; pinning with no sink);
    anything else NotImplementedError."""
    q = dense("qvg", sink=2)
    q.reset_pinned_sink()
    with pytest.raises(NotImplementedError):
        q.pin_current_chunk(4)
    dense("qvg", sink=0).pin_current_chunk(4)  # the engine resets (nothing pinned): a no-op
    with pytest.raises(NotImplementedError):
        qt.CausalSelfAttentionKVCache(k=torch.zeros(1, 8, 2, 4), v=torch.zeros(1, 8, 2, 4),
                                      global_end_index=index_tensor(), local_end_index=index_tensor(),
                                      global_sink_tokens=2)
    e = dense("engine", sink=2)
    call(e, chunk(4), 0)
    e.pin_current_chunk(4)
    assert e.pinned_len == 2


# ---- packed ----------------------------------------------------------------------


def test_packed_view_holds_written_heads_only():
    """Engine: a head-sliced call's view holds every head of the cache. qvg: only the
    written heads [cache_head_start, + h_in) (spec 3.1), as the engine's dense cache."""
    e, q = packed("engine", H=4), packed("qvg", H=4)
    ve, vq = call(e, chunk(2, H=2), 0, hs=2), call(q, chunk(2, H=2), 0, hs=2)
    assert ve.k.shape[2] == 4 and vq.k.shape[2] == 2
    assert bits_equal(ve.k[:, :, 2:], vq.k)


def test_packed_local_indices_locate_the_chunk_in_the_view():
    """Engine: local_start_index, local_end_index = 0, n. qvg: T - n, T (the chunk's
    place in the returned k/v, spec 3.1)."""
    e, q = packed("engine"), packed("qvg")
    for c in (e, q):
        call(c, chunk(4), 0)
    ve, vq = call(e, chunk(2), 4), call(q, chunk(2), 4)
    assert (ve.local_start_index, ve.local_end_index) == (0, 2)
    assert (vq.local_start_index, vq.local_end_index) == (4, 6)


def test_packed_recent_window_stops_at_the_tail():
    """Engine: with recent_window_tokens reaching past the window's tail, the view also
    shows the retained tokens of a segment straddling the tail (tokens the dense cache
    has evicted). qvg: lo = max(tail_start, c - rw), the dense cache's view."""
    e, q, d = packed("engine", S=6), packed("qvg", S=6), dense("qvg", S=6)
    for g in range(0, 12, 4):
        pass
    for c in (e, q, d):
        call(c, chunk(4, fill=1), 0)
        call(c, chunk(4, fill=2), 4)
    ve, vq, vd = call(e, chunk(4, fill=3), 8, rw=100), call(q, chunk(4, fill=3), 8, rw=100), call(
        d, chunk(4, fill=3), 8, rw=100)
    assert ve.k.shape[1] == 8 and vq.k.shape[1] == 6
    assert bits_equal(vq.k, vd.k)


@pytest.mark.parametrize("case", ["chunk_longer_than_cache", "sink_overwrite", "chunk_beyond_window"])
def test_packed_refusals(case):
    """Engine: accepts (the packed cache never moves tokens, so nothing is overwritten,
    but the view is not what the dense cache shows). qvg: RuntimeError, as the dense
    cache (spec 4)."""
    S, sink, window, calls = {
        "chunk_longer_than_cache": (8, 0, None, [(0, 10)]),
        "sink_overwrite": (8, 4, None, [(0, 4), (4, 4), (8, 6)]),
        "chunk_beyond_window": (8, 0, 3, [(0, 4)]),
    }[case]
    e, q = packed("engine", S=S, sink=sink, window=window), packed("qvg", S=S, sink=sink, window=window)
    for c, n in calls[:-1]:
        call(e, chunk(n), c)
        call(q, chunk(n), c)
    c, n = calls[-1]
    call(e, chunk(n), c)
    with pytest.raises(RuntimeError):
        call(q, chunk(n), c)


def test_packed_error_precedence():
    """Two faults (a chunk longer than the cache at a non-sequential start): engine
    NotImplementedError, qvg RuntimeError (the length is checked first)."""
    e, q = packed("engine"), packed("qvg")
    for c in (e, q):
        call(c, chunk(4), 0)
    with pytest.raises(NotImplementedError):
        call(e, chunk(10), 6)
    with pytest.raises(RuntimeError):
        call(q, chunk(10), 6)


def test_packed_validates_before_mutating():
    """Engine: an advance with recent_window_tokens = -1 appends the segment, then raises
    ValueError. qvg: ValueError and nothing changed."""
    e, q = packed("engine"), packed("qvg")
    for c in (e, q):
        call(c, chunk(4), 0)
    before = snapshot(q)
    with pytest.raises(ValueError):
        call(e, chunk(2), 4, rw=-1)
    with pytest.raises(ValueError):
        call(q, chunk(2), 4, rw=-1)
    assert e._global_end == 6
    assert same_snapshot(snapshot(q), before)


def test_packed_constructor_extensions():
    """Engine: quant_args is required, no allow_growth parameter, any dtype. qvg:
    quant_args=None means off, allow_growth must be False (NotImplementedError),
    dtype float32/bfloat16/float16 (ValueError otherwise)."""
    kw = dict(batch_size=1, cache_size=8, num_heads=2, head_dim=4, device="cpu", global_end_index=index_tensor(),
              local_end_index=index_tensor())
    with pytest.raises(TypeError):
        eng_packed_mod.QVGPackedCausalKVCache(dtype=torch.float32, **kw)
    qt.QVGPackedCausalKVCache(dtype=torch.float32, quant_args=None, **kw)
    with pytest.raises(NotImplementedError):
        qt.QVGPackedCausalKVCache(dtype=torch.float32, quant_args=None, allow_growth=True, **kw)
    eng_packed_mod.QVGPackedCausalKVCache(dtype=torch.float64, quant_args=eng_quant_mod.QVGKVQuantArgs(), **kw)
    with pytest.raises(ValueError):
        qt.QVGPackedCausalKVCache(dtype=torch.float64, quant_args=None, **kw)


def test_packed_settings_checked_against_head_dim_at_construction():
    """Engine: a packed cache with quantization on and block_size not dividing head_dim
    is built; the mismatch surfaces only when a chunk is first packed (inside the
    reference's kernels). qvg: ValueError when the cache is built (spec 2)."""
    kw = dict(batch_size=1, cache_size=8, num_heads=1, head_dim=4, dtype=torch.float32, device=torch.device("cpu"),
              global_end_index=index_tensor(), local_end_index=index_tensor())
    eng_packed_mod.QVGPackedCausalKVCache(quant_args=eng_quant_mod.QVGKVQuantArgs(bits=4), **kw)
    with pytest.raises(ValueError, match="block_size must divide head_dim"):
        qt.QVGPackedCausalKVCache(quant_args=qt.QVGKVQuantArgs(bits=4), **kw)
