"""Views alias cache memory where the spec promises no copy, checked through data
pointers; copied views are the caller's; no view ever dangles."""

from __future__ import annotations

import gc

import torch

from conftest import bits_equal, chunk, make_dense, make_packed
import qvg.torch as qt


def storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()  # torch 2.x: TypedStorage is deprecated


def test_dense_buffers_are_the_callers_tensors(gen):
    k = torch.zeros(2, 16, 2, 8, dtype=torch.bfloat16)
    v = torch.zeros_like(k)
    cache = qt.CausalSelfAttentionKVCache(k=k, v=v, global_end_index=torch.zeros(1, dtype=torch.long),
                                          local_end_index=torch.zeros(1, dtype=torch.long))
    assert cache.k is k and cache.v is v
    x = chunk(gen, 2, 4, 2, 8, torch.bfloat16)
    cache.update_and_get_attention_kv(key=x, value=-x, current_chunk_start=0)
    assert bits_equal(k[:, :4], x) and bits_equal(v[:, :4], -x)
    assert cache.resident_nbytes() == 2 * k.numel() * k.element_size()


def test_dense_single_range_view_aliases_the_buffer(gen):
    cache = make_dense(1, 16, 4, 8, sink=2)
    esz = cache.k.element_size()
    for c in range(0, 28, 4):
        x = chunk(gen, 1, 4, 4, 8)
        view = cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=c)
        assert view.zero_copy
        start = view.visible_local_end - view.k.shape[1]
        assert view.k.data_ptr() == cache.k.data_ptr() + start * 4 * 8 * esz
        assert view.v.data_ptr() == cache.v.data_ptr() + start * 4 * 8 * esz
        assert storage_ptr(view.k) == storage_ptr(cache.k)
    # A head-sliced view is a strided view into the same buffer.
    x = chunk(gen, 1, 4, 2, 8)
    view = cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=28, cache_head_start=1)
    assert view.zero_copy and view.k.shape == (1, 16, 2, 8)
    assert view.k.stride() == (16 * 4 * 8, 4 * 8, 8, 1)
    assert view.k.data_ptr() == cache.k.data_ptr() + 1 * 8 * esz
    assert bits_equal(view.k[:, -4:], x)
    # Like the engine's slices, the view follows the buffer.
    cache.k[0, 0, 1, 0] = 42.0
    assert view.k[0, 0, 0, 0].item() == 42.0


def test_dense_two_range_view_is_a_fresh_tensor(gen):
    cache = make_dense(1, 16, 2, 8, sink=4)
    for c in range(0, 32, 4):
        x = chunk(gen, 1, 4, 2, 8)
        view = cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=c, recent_window_tokens=4)
    assert not view.zero_copy and view.k.shape[1] == 4 + 4 + 4
    assert storage_ptr(view.k) != storage_ptr(cache.k)
    kept = view.k.clone()
    for c in range(32, 48, 4):
        x = chunk(gen, 1, 4, 2, 8)
        cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=c, recent_window_tokens=4)
    assert bits_equal(view.k, kept)  # the caller's tensor, untouched by later calls


def test_dense_growth_exposes_new_tensors(gen):
    cache = make_dense(1, 8, 2, 8, growth=True)
    old_k = cache.k
    xs = [chunk(gen, 1, 4, 2, 8) for _ in range(4)]
    for i, x in enumerate(xs[:2]):
        cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=4 * i)
    old_view = cache.update_and_get_attention_kv(key=xs[1], value=xs[1], current_chunk_start=4)
    view = cache.update_and_get_attention_kv(key=xs[2], value=xs[2], current_chunk_start=8)
    assert cache.cache_size == 16 and cache.attention_window_size == 16
    assert cache.k is not old_k and cache.k.shape == (1, 16, 2, 8)
    assert view.zero_copy and storage_ptr(view.k) == storage_ptr(cache.k)
    assert bits_equal(view.k, torch.cat(xs[:3], dim=1))
    assert bits_equal(old_view.k, torch.cat(xs[:2], dim=1))  # old buffers stay valid
    assert cache.resident_nbytes() == 2 * cache.k.numel() * 4
    view = cache.update_and_get_attention_kv(key=xs[3], value=xs[3], current_chunk_start=12)
    assert bits_equal(view.k, torch.cat(xs, dim=1)) and cache.cache_size == 16


def test_packed_view_inside_current_chunk_aliases_it(gen):
    cache = make_packed(1, 16, 2, 8, dtype=torch.bfloat16)
    x = chunk(gen, 1, 4, 2, 8, torch.bfloat16)
    view = cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=0)
    seg = cache._segments()[-1]
    assert view.zero_copy and seg["current"]
    assert view.k.data_ptr() == seg["k_ptr"] and view.v.data_ptr() == seg["v_ptr"]
    ptr = view.k.data_ptr()
    del view
    for _ in range(3):  # denoising steps rewrite the current chunk in place
        y = chunk(gen, 1, 4, 2, 8, torch.bfloat16)
        view = cache.update_and_get_attention_kv(key=y, value=y, current_chunk_start=0)
        assert view.k.data_ptr() == ptr and bits_equal(view.k, y)
        del view
    # rw = 0, no sink: the view is the current chunk only, again without a copy.
    for c in (4, 8):
        z = chunk(gen, 1, 4, 2, 8, torch.bfloat16)
        view = cache.update_and_get_attention_kv(key=z, value=z, current_chunk_start=c, recent_window_tokens=0)
        seg = cache._segments()[-1]
        assert view.zero_copy and view.k.data_ptr() == seg["k_ptr"] and bits_equal(view.k, z)
        # a head slice of it is a strided view into the same segment
        view = cache.update_and_get_attention_kv(key=z[:, :, 1:], value=z[:, :, 1:], current_chunk_start=c,
                                                 cache_head_start=1, recent_window_tokens=0)
        assert view.zero_copy and view.k.data_ptr() == seg["k_ptr"] + 8 * 2
        assert view.k.stride() == (4 * 2 * 8, 2 * 8, 8, 1)
        del view
    view = cache.update_and_get_attention_kv(key=z, value=z, current_chunk_start=8)
    assert not view.zero_copy  # spans several segments: decoded/copied into a fresh tensor
    assert all(not (s["k_ptr"] <= view.k.data_ptr() < s["k_ptr"] + s["nbytes"]) for s in cache._segments())


def test_packed_held_view_never_dangles(gen):
    """A zero-copy view still held at the next call gets a private copy first; it
    stays readable after its segment was packed and evicted, and after the cache
    object is gone."""
    q = qt.QVGKVQuantArgs(bits=4, block_size=8, centroids=4, keep_recent_chunks=0)
    cache = make_packed(1, 8, 2, 8, quant=q)
    x = chunk(gen, 1, 4, 2, 8)
    held = cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=0)
    assert held.zero_copy
    alias_ptr = held.k.data_ptr()
    for c in range(4, 32, 4):  # chunk 0 is packed, then evicted
        y = chunk(gen, 1, 4, 2, 8)
        cache.update_and_get_attention_kv(key=y, value=y, current_chunk_start=c)
    assert held.k.data_ptr() != alias_ptr
    assert bits_equal(held.k, x) and bits_equal(held.v, x)
    last = cache.update_and_get_attention_kv(key=y, value=y, current_chunk_start=28, recent_window_tokens=0)
    assert last.zero_copy
    del cache
    gc.collect()
    assert bits_equal(last.k, y)  # the tensor keeps the C++ cache's memory alive


def test_noncontiguous_inputs_are_accepted(gen):
    dense, packed = make_dense(1, 16, 2, 8), make_packed(1, 16, 2, 8)
    base = chunk(gen, 1, 2, 4, 8)  # [B, h, n, D] memory order
    key = base.transpose(1, 2)  # [B, n=4, h=2, D], not contiguous
    assert not key.is_contiguous()
    for cache in (dense, packed):
        view = cache.update_and_get_attention_kv(key=key, value=key, current_chunk_start=0)
        assert bits_equal(view.k, key.contiguous())


def test_a_key_that_is_a_slice_of_the_cache_buffer_acts_like_its_clone():
    """docs/reliability.md, finding 11: a dense cache given ``cache.k[:, a:b]`` as the key of an
    evicting call returns the same view as for a clone of that slice (qvg copies an
    argument that overlaps its own memory first; docs/design.md)."""
    from conftest import bits_equal, make_dense

    def run(use_alias: bool):
        cache = make_dense(S=8, H=2, D=4)
        g = torch.Generator().manual_seed(11)
        for c in range(0, 8, 4):
            k = torch.randn(1, 4, 2, 4, generator=g)
            cache.update_and_get_attention_kv(key=k, value=k.clone(), current_chunk_start=c)
        key = cache.k[:, 0:4] if use_alias else cache.k[:, 0:4].clone()
        val = cache.v[:, 2:6] if use_alias else cache.v[:, 2:6].clone()
        out = cache.update_and_get_attention_kv(key=key, value=val, current_chunk_start=8)  # evicts and rolls
        return out.k.clone(), out.v.clone(), cache.k.clone(), cache.v.clone()

    for a, b in zip(run(True), run(False)):
        assert bits_equal(a, b)
