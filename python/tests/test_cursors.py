"""Index tensors, *_int cursors and reset_indices, as the engine behaves.

Dense: cursors are read from the index tensors on the first call unless both
*_int cursors are given; from then on the *_int attributes are the source of
truth and the tensors are written only when a call changes the cursors.
Packed: the tensors are written after every call, unless use_int_indices, where
only the *_int attributes are (reset_indices zeroes both).
"""

from __future__ import annotations

import torch

from conftest import bits_equal, chunk, index_tensor, make_dense, make_packed
import qvg.torch as qt


def test_dense_reads_index_tensors_on_first_call(gen):
    cache = make_dense(1, 16, 2, 8)
    first = chunk(gen, 1, 4, 2, 8)
    cache.update_and_get_attention_kv(key=first, value=first, current_chunk_start=0)
    # A second cache over the same buffers, resuming from the engine's index tensors.
    resumed = qt.CausalSelfAttentionKVCache(
        k=cache.k, v=cache.v, global_end_index=index_tensor(4), local_end_index=index_tensor(4))
    assert resumed.global_end_index_int is None
    nxt = chunk(gen, 1, 4, 2, 8)
    view = resumed.update_and_get_attention_kv(key=nxt, value=nxt, current_chunk_start=4)
    assert (view.local_start_index, view.visible_global_end, view.visible_local_end) == (4, 8, 8)
    assert bits_equal(view.k[:, :4], first) and bits_equal(view.k[:, 4:], nxt)
    assert (resumed.global_end_index_int, resumed.local_end_index_int) == (8, 8)
    assert int(resumed.global_end_index) == 8 and int(resumed.local_end_index) == 8


def test_dense_int_cursors_are_the_source_of_truth(gen):
    cache = make_dense(1, 16, 2, 8, ints=True)
    cache.global_end_index.fill_(999)  # never read in int mode
    cache.local_end_index.fill_(999)
    x = chunk(gen, 1, 4, 2, 8)
    view = cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=0)
    assert view.local_start_index == 0 and view.visible_global_end == 4
    assert (cache.global_end_index_int, cache.local_end_index_int) == (4, 4)
    assert int(cache.global_end_index) == 4  # written: the cursors changed
    # A rewrite (denoising step) changes no cursor: the tensors are not written.
    cache.global_end_index.fill_(-7)
    cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=0)
    assert int(cache.global_end_index) == -7
    # Changing the int cursors from outside moves the cache (the engine's contract).
    cache.global_end_index_int = 0
    cache.local_end_index_int = 0
    y = chunk(gen, 1, 4, 2, 8)
    view = cache.update_and_get_attention_kv(key=y, value=y, current_chunk_start=0)
    assert view.k.shape[1] == 4 and bits_equal(view.k, y)


def test_dense_reset_indices(gen):
    for ints in (False, True):
        cache = make_dense(1, 8, 2, 8, ints=ints)
        chunks = [chunk(gen, 1, 4, 2, 8) for _ in range(3)]
        first_views = []
        for i, x in enumerate(chunks):
            first_views.append(cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=4 * i).k.clone())
        cache.reset_indices()
        assert int(cache.global_end_index) == 0 and int(cache.local_end_index) == 0
        if ints:
            assert (cache.global_end_index_int, cache.local_end_index_int) == (0, 0)
        for i, x in enumerate(chunks):
            view = cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=4 * i)
            assert bits_equal(view.k, first_views[i])


def test_packed_index_tensors_written_every_call(gen):
    cache = make_packed(1, 16, 2, 8)
    assert cache.global_end_index_int is None
    x = chunk(gen, 1, 4, 2, 8)
    cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=0)
    assert int(cache.global_end_index) == 4 and int(cache.local_end_index) == 4
    cache.global_end_index.fill_(-1)
    cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=0)  # rewrite: still written
    assert int(cache.global_end_index) == 4
    for c in range(4, 40, 4):
        cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=c)
    assert int(cache.global_end_index) == 40 and int(cache.local_end_index) == 16


def test_packed_use_int_indices(gen):
    cache = make_packed(1, 16, 2, 8, ints=True, quant=qt.QVGKVQuantArgs(bits=4, block_size=8, centroids=4))
    assert (cache.global_end_index_int, cache.local_end_index_int) == (0, 0)
    cache.global_end_index.fill_(123)
    cache.local_end_index.fill_(123)
    xs = [chunk(gen, 1, 4, 2, 8) for _ in range(8)]
    views = []
    for i, x in enumerate(xs):
        views.append(cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=4 * i).k.clone())
        assert cache.global_end_index_int == 4 * (i + 1)
        assert cache.local_end_index_int == min(4 * (i + 1), 16)
    assert int(cache.global_end_index) == 123 and int(cache.local_end_index) == 123  # never written
    assert any(s["packed"] for s in cache._segments())
    cache.reset_indices()
    assert (cache.global_end_index_int, cache.local_end_index_int) == (0, 0)
    assert int(cache.global_end_index) == 0 and int(cache.local_end_index) == 0
    assert cache.resident_nbytes() == 0 and cache._segments() == [] and cache.chunk_tokens is None
    # An empty cache again: the replay gives the same views as the first run.
    for i, x in enumerate(xs):
        view = cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=4 * i)
        assert bits_equal(view.k, views[i])


def test_can_direct_current_attention_and_heads():
    dense = make_dense(1, 8, 3, 8)
    packed = make_packed(1, 8, 3, 8)
    for cache in (dense, packed):
        assert cache.can_direct_current_attention(8)
        assert not cache.can_direct_current_attention(4)
        assert cache.num_cache_heads == 3
    assert not make_dense(1, 8, 3, 8, sink=2).can_direct_current_attention(8)
    assert not make_packed(1, 8, 3, 8, window=4).can_direct_current_attention(8)
