"""Snapshots from Python (docs/snapshot.md): QVGPackedCausalKVCache.save / load /
snapshot_bytes / from_snapshot_bytes. A loaded cache must answer every later call
exactly as the saved one would (views bit for bit, cursors, resident bytes), and
save to the same bytes; a snapshot of another configuration, or damaged bytes, is a
ValueError naming the field or the section."""

from __future__ import annotations

import random

import pytest
import torch

import qvg.torch as qt
from conftest import bits_equal, index_tensor

B, S, H, D = 1, 48, 2, 16


def kwargs(quant, *, ints=False, sink=4, window=None, dtype=torch.bfloat16):
    return dict(batch_size=B, cache_size=S, num_heads=H, head_dim=D, dtype=dtype, device="cpu",
                global_end_index=index_tensor(), local_end_index=index_tensor(), use_int_indices=ints,
                sink_tokens=sink, attention_window_size=window, quant_args=quant)


QUANTS = [
    None,
    qt.QVGKVQuantArgs(bits=2, centroids=4, block_size=8, keep_recent_chunks=0),
    qt.QVGKVQuantArgs(bits=4, centroids=8, block_size=16, span_chunks=2, init="warm", scaling="compat"),
    qt.QVGKVQuantArgs(bits=2, centroids=4, block_size=8, stages=2, asymmetric=True, sink_span="full"),
]


def calls(rng: random.Random, n_chunks: int, chunk: int):
    c = 0
    for _ in range(n_chunks):
        for _ in range(rng.randint(1, 2)):
            yield c, chunk, rng.choice([None, 0, 3, 100])
        c += chunk


def step(cache, g, c, n, rw, dtype):
    k = torch.randn(B, n, H, D, generator=g).to(dtype)
    v = torch.randn(B, n, H, D, generator=g).to(dtype)
    return cache.update_and_get_attention_kv(key=k, value=v, current_chunk_start=c, recent_window_tokens=rw)


def cursors(cache):
    if cache.global_end_index_int is not None:
        return cache.global_end_index_int, cache.local_end_index_int
    return int(cache.global_end_index), int(cache.local_end_index)


@pytest.mark.parametrize("qi", range(len(QUANTS)))
@pytest.mark.parametrize("seed", range(6))
def test_loaded_cache_answers_every_later_call_as_the_saved_one(tmp_path, qi, seed):
    rng = random.Random(seed * 31 + qi)
    quant = QUANTS[qi]
    ints = seed % 2 == 1
    window = None if seed % 3 else 24
    chunk = rng.choice([4, 6, 8])
    plan = list(calls(rng, 10, chunk))
    cut = rng.randrange(1, len(plan))
    a = qt.QVGPackedCausalKVCache(**kwargs(quant, ints=ints, window=window))
    g = torch.Generator().manual_seed(seed)
    for c, n, rw in plan[:cut]:
        step(a, g, c, n, rw, torch.bfloat16)
    path = tmp_path / "cache.qvgs"
    a.save(path)
    data = a.snapshot_bytes()
    assert path.read_bytes() == data
    b = qt.QVGPackedCausalKVCache.load(path, **kwargs(quant, ints=ints, window=window))
    c2 = qt.QVGPackedCausalKVCache.from_snapshot_bytes(data, **kwargs(quant, ints=ints, window=window))
    for loaded in (b, c2):
        assert cursors(loaded) == cursors(a)
        assert loaded.resident_nbytes() == a.resident_nbytes()
        assert loaded.snapshot_bytes() == data
    for c, n, rw in plan[cut:]:  # the saved cache is the reference of the later calls
        k = torch.randn(B, n, H, D, generator=g).to(torch.bfloat16)
        v = torch.randn(B, n, H, D, generator=g).to(torch.bfloat16)
        want = a.update_and_get_attention_kv(key=k, value=v, current_chunk_start=c, recent_window_tokens=rw)
        for other in (b, c2):
            got = other.update_and_get_attention_kv(key=k.clone(), value=v.clone(), current_chunk_start=c,
                                                    recent_window_tokens=rw)
            assert bits_equal(got.k, want.k) and bits_equal(got.v, want.v)
            assert (got.local_start_index, got.local_end_index, got.visible_local_end, got.visible_global_end) == (
                want.local_start_index, want.local_end_index, want.visible_local_end, want.visible_global_end)
            assert cursors(other) == cursors(a)
            assert other.resident_nbytes() == a.resident_nbytes()
    assert b.snapshot_bytes() == a.snapshot_bytes()


def test_continuing_the_saved_and_the_loaded_cache_gives_equal_views(tmp_path):
    quant = QUANTS[1]
    a = qt.QVGPackedCausalKVCache(**kwargs(quant))
    g = torch.Generator().manual_seed(5)
    for c in range(0, 40, 8):
        step(a, g, c, 8, None, torch.bfloat16)
    a.save(tmp_path / "x.qvgs")
    b = qt.QVGPackedCausalKVCache.load(tmp_path / "x.qvgs", **kwargs(quant))
    for c in range(40, 120, 8):
        k = torch.randn(B, 8, H, D, generator=g).to(torch.bfloat16)
        v = torch.randn(B, 8, H, D, generator=g).to(torch.bfloat16)
        va = a.update_and_get_attention_kv(key=k, value=v, current_chunk_start=c)
        vb = b.update_and_get_attention_kv(key=k.clone(), value=v.clone(), current_chunk_start=c)
        assert bits_equal(va.k, vb.k) and bits_equal(va.v, vb.v)
        assert a.resident_nbytes() == b.resident_nbytes()
    assert a.snapshot_bytes() == b.snapshot_bytes()


def test_another_configuration_is_refused_naming_the_field(tmp_path):
    a = qt.QVGPackedCausalKVCache(**kwargs(QUANTS[1]))
    a.save(tmp_path / "x.qvgs")
    other = qt.QVGKVQuantArgs(bits=2, centroids=8, block_size=8, keep_recent_chunks=0)
    with pytest.raises(ValueError, match=r"the snapshot's cache has centroids = 4, the caller expects 8"):
        qt.QVGPackedCausalKVCache.load(tmp_path / "x.qvgs", **kwargs(other))
    with pytest.raises(ValueError, match=r"sink_tokens"):
        qt.QVGPackedCausalKVCache.load(tmp_path / "x.qvgs", **kwargs(QUANTS[1], sink=0))


def test_a_head_shard_keeps_its_head_offset(tmp_path):
    # A shard's encodings draw its global heads' PRNG streams (init="random"): the
    # snapshot stores head_offset (format 1.2), the loaded cache continues bit for bit,
    # and a caller expecting another offset is refused naming the field; one who does
    # not say gets the snapshot's (keyword arguments are an expectation:
    # docs/snapshot.md).
    quant = qt.QVGKVQuantArgs(bits=2, centroids=4, block_size=8, keep_recent_chunks=0, init="random")
    a = qt.QVGPackedCausalKVCache(**kwargs(quant), head_offset=3)
    g = torch.Generator().manual_seed(9)
    for c in range(0, 24, 8):
        step(a, g, c, 8, None, torch.bfloat16)
    a.save(tmp_path / "shard.qvgs")
    with pytest.raises(ValueError, match=r"the snapshot's cache has head_offset = 3, the caller expects 0"):
        qt.QVGPackedCausalKVCache.load(tmp_path / "shard.qvgs", **kwargs(quant), head_offset=0)
    assert qt.QVGPackedCausalKVCache.load(tmp_path / "shard.qvgs", **kwargs(quant)).head_offset == 3
    b = qt.QVGPackedCausalKVCache.load(tmp_path / "shard.qvgs", **kwargs(quant), head_offset=3)
    for c in range(24, 64, 8):
        k = torch.randn(B, 8, H, D, generator=g).to(torch.bfloat16)
        v = torch.randn(B, 8, H, D, generator=g).to(torch.bfloat16)
        va = a.update_and_get_attention_kv(key=k, value=v, current_chunk_start=c)
        vb = b.update_and_get_attention_kv(key=k.clone(), value=v.clone(), current_chunk_start=c)
        assert bits_equal(va.k, vb.k) and bits_equal(va.v, vb.v)
    assert a.snapshot_bytes() == b.snapshot_bytes()


def test_damaged_bytes_are_value_errors_naming_the_section(tmp_path):
    a = qt.QVGPackedCausalKVCache(**kwargs(QUANTS[1]))
    g = torch.Generator().manual_seed(1)
    for c in range(0, 32, 8):
        step(a, g, c, 8, None, torch.bfloat16)
    data = bytearray(a.snapshot_bytes())
    for cut in (0, 10, len(data) // 2, len(data) - 1):
        with pytest.raises(ValueError, match=r"invalid snapshot"):
            qt.QVGPackedCausalKVCache.from_snapshot_bytes(bytes(data[:cut]), **kwargs(QUANTS[1]))
    rng = random.Random(3)
    for _ in range(50):
        bad = bytearray(data)
        bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        with pytest.raises(ValueError, match=r"invalid snapshot|the snapshot's cache has"):
            qt.QVGPackedCausalKVCache.from_snapshot_bytes(bytes(bad), **kwargs(QUANTS[1]))
    with pytest.raises(ValueError, match=r"data must be bytes"):
        qt.QVGPackedCausalKVCache.from_snapshot_bytes("not bytes", **kwargs(QUANTS[1]))  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match=r"missing"):
        qt.QVGPackedCausalKVCache.load(tmp_path / "missing.qvgs", **kwargs(QUANTS[1]))
    # The same errors without keyword arguments (the settings come from the snapshot).
    for cut in (0, 10, len(data) // 2):
        with pytest.raises(ValueError, match=r"invalid snapshot"):
            qt.QVGPackedCausalKVCache.from_snapshot_bytes(bytes(data[:cut]))
    for _ in range(50):
        bad = bytearray(data)
        bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        with pytest.raises(ValueError, match=r"invalid snapshot"):
            qt.QVGPackedCausalKVCache.from_snapshot_bytes(bytes(bad))


def test_a_failed_restore_leaves_the_cache_as_it_was():
    a = qt.QVGPackedCausalKVCache(**kwargs(QUANTS[1]))
    g = torch.Generator().manual_seed(2)
    for c in range(0, 24, 8):
        step(a, g, c, 8, None, torch.bfloat16)
    before = a._c.debug_state()
    data = a.snapshot_bytes()
    with pytest.raises(ValueError):
        a._c.restore(data[:-3], True)
    assert a._c.debug_state() == before
    assert a.snapshot_bytes() == data


# ---- the dense cache -------------------------------------------------------------------
def dense_kwargs(size=16, *, ints=False, sink=0, window=0, growth=False, dtype=torch.float32):
    return dict(k=torch.zeros(B, size, H, D, dtype=dtype), v=torch.zeros(B, size, H, D, dtype=dtype),
                global_end_index=index_tensor(), local_end_index=index_tensor(),
                global_end_index_int=0 if ints else None, local_end_index_int=0 if ints else None,
                sink_tokens=sink, attention_window_size=window, allow_growth=growth)


@pytest.mark.parametrize("seed", range(8))
def test_dense_loaded_cache_answers_every_later_call_as_the_saved_one(tmp_path, seed):
    rng = random.Random(seed)
    growth = seed % 2 == 0
    kw = lambda: dense_kwargs(ints=seed % 3 == 0, sink=rng_sink, window=rng_window, growth=growth)  # noqa: E731
    rng_sink = rng.choice([0, 2, 4])
    rng_window = 0 if growth else rng.choice([0, 8, 12])
    a = qt.CausalSelfAttentionKVCache(**kw())
    g = torch.Generator().manual_seed(seed)
    c = 0
    plan = []
    for _ in range(12):
        n = rng.choice([2, 3, 4]) if not growth else rng.choice([3, 4, 6])
        plan += [(c, n, rng.choice([None, 0, 2, 50])) for _ in range(rng.randint(1, 2))]
        c += n
    cut = rng.randrange(1, len(plan))
    for c, n, rw in plan[:cut]:
        step(a, g, c, n, rw, torch.float32)
    a.save(tmp_path / "d.qvgs")
    data = a.snapshot_bytes()
    assert (tmp_path / "d.qvgs").read_bytes() == data
    b = qt.CausalSelfAttentionKVCache.load(tmp_path / "d.qvgs", **kw())
    c2 = qt.CausalSelfAttentionKVCache.from_snapshot_bytes(data, **kw())
    for other in (b, c2):
        assert (other.global_end_index_int, other.local_end_index_int) == a._cursors()
        assert (int(other.global_end_index), int(other.local_end_index)) == a._cursors()
        assert other.cache_size == a.cache_size and bits_equal(other.k, a.k) and bits_equal(other.v, a.v)
        assert other.snapshot_bytes() == data
    for c, n, rw in plan[cut:]:
        k = torch.randn(B, n, H, D, generator=g)
        v = torch.randn(B, n, H, D, generator=g)
        want = a.update_and_get_attention_kv(key=k, value=v, current_chunk_start=c, recent_window_tokens=rw)
        for other in (b, c2):
            got = other.update_and_get_attention_kv(key=k.clone(), value=v.clone(), current_chunk_start=c,
                                                    recent_window_tokens=rw)
            assert bits_equal(got.k, want.k) and bits_equal(got.v, want.v)
            assert (got.local_start_index, got.local_end_index, got.visible_local_end, got.visible_global_end) == (
                want.local_start_index, want.local_end_index, want.visible_local_end, want.visible_global_end)
            assert other._cursors() == a._cursors() and other.resident_nbytes() == a.resident_nbytes()


def test_dense_snapshot_of_another_size_or_kind_is_refused(tmp_path):
    a = qt.CausalSelfAttentionKVCache(**dense_kwargs(16))
    a.save(tmp_path / "d.qvgs")
    with pytest.raises(ValueError, match=r"the snapshot's cache has cache_size = 16, the caller expects 32"):
        qt.CausalSelfAttentionKVCache.load(tmp_path / "d.qvgs", **dense_kwargs(32))
    with pytest.raises(ValueError, match=r"holds a dense cache; a packed cache cannot be loaded"):
        qt.QVGPackedCausalKVCache.load(tmp_path / "d.qvgs", **kwargs(None))
    p = qt.QVGPackedCausalKVCache(**kwargs(None))
    with pytest.raises(ValueError, match=r"holds a packed cache; a dense cache cannot be loaded"):
        qt.CausalSelfAttentionKVCache.from_snapshot_bytes(p.snapshot_bytes(), **dense_kwargs(16))
    data = a.snapshot_bytes()
    with pytest.raises(ValueError, match=r"invalid snapshot"):
        qt.CausalSelfAttentionKVCache.from_snapshot_bytes(data[: len(data) // 2], **dense_kwargs(16))


# ---- load(path) without keyword arguments (docs/snapshot.md) -------------------------


# Every kind of setting the config holds: per-role overrides, incremental spans with
# adaptive breaks and refinement layers, the scale search.
LOAD_QUANTS = QUANTS + [
    qt.QVGKVQuantArgs(bits=4, centroids=8, block_size=16, k_config="bits=2,scale_search=mse", v_config="centroids=4",
                      span_mode="incremental", span_chunks=2, span_break_ratio=0.5, refine_recent=1, refine_bits=2,
                      keep_recent_chunks=0, scale_search="mse", seed=7),
]


@pytest.mark.parametrize("qi", range(len(LOAD_QUANTS)))
def test_load_rebuilds_from_the_snapshot_alone(tmp_path, qi):
    """The snapshot holds the whole configuration: load(path) and
    from_snapshot_bytes(data) need no keyword argument (as the C++ load(path)), give a
    CPU cache of the saved options and quant args with the saved cursors, and answer
    later calls bit for bit as the saved cache."""
    quant = LOAD_QUANTS[qi]
    a = qt.QVGPackedCausalKVCache(**kwargs(quant, window=24 if qi % 2 else None, sink=4))
    g = torch.Generator().manual_seed(qi)
    for c in range(0, 5 * 6, 6):
        step(a, g, c, 6, None, torch.bfloat16)
    path = tmp_path / "cache.qvgs"
    a.save(path)
    for b in (qt.QVGPackedCausalKVCache.load(path), qt.QVGPackedCausalKVCache.load(str(path)),
              qt.QVGPackedCausalKVCache.from_snapshot_bytes(a.snapshot_bytes())):
        assert (b.batch_size, b.cache_size, b.num_heads, b.head_dim, b.dtype, b.sink_tokens) == (B, S, H, D,
                                                                                                 torch.bfloat16, 4)
        assert b.attention_window_size == a.attention_window_size and b.device == torch.device("cpu")
        assert b.q == (quant if quant is not None else qt.QVGKVQuantArgs())
        assert cursors(b) == cursors(a) and b.resident_nbytes() == a.resident_nbytes()
        assert b.snapshot_bytes() == a.snapshot_bytes()
    b = qt.QVGPackedCausalKVCache.load(path)
    for c in range(30, 48, 6):
        k = torch.randn(B, 6, H, D, generator=g).to(torch.bfloat16)
        v = torch.randn(B, 6, H, D, generator=g).to(torch.bfloat16)
        va = a.update_and_get_attention_kv(key=k, value=v, current_chunk_start=c)
        vb = b.update_and_get_attention_kv(key=k, value=v, current_chunk_start=c)
        assert bits_equal(va.k, vb.k) and bits_equal(va.v, vb.v)


def test_load_keyword_arguments_are_an_optional_expectation(tmp_path):
    """Given keyword arguments must match the snapshot (ValueError naming the field);
    the runtime ones (index tensors, int cursors) are taken as given."""
    quant = QUANTS[1]
    a = qt.QVGPackedCausalKVCache(**kwargs(quant))
    g = torch.Generator().manual_seed(3)
    for c in range(0, 24, 6):
        step(a, g, c, 6, None, torch.bfloat16)
    path = tmp_path / "cache.qvgs"
    a.save(path)
    b = qt.QVGPackedCausalKVCache.load(path, use_int_indices=True, num_heads=H, quant_args=quant)
    assert b.global_end_index_int == 24 and cursors(b) == cursors(a)
    gi, li = index_tensor(), index_tensor()
    b = qt.QVGPackedCausalKVCache.load(path, global_end_index=gi, local_end_index=li)
    assert b.global_end_index is gi and int(gi) == 24 and int(li) == 24
    with pytest.raises(ValueError, match="cache_size"):
        qt.QVGPackedCausalKVCache.load(path, cache_size=S + 8)
    with pytest.raises(ValueError, match="centroids"):
        qt.QVGPackedCausalKVCache.load(path, quant_args=qt.QVGKVQuantArgs(bits=2, centroids=8, block_size=8,
                                                                          keep_recent_chunks=0))


def test_load_of_a_missing_file_is_file_not_found(tmp_path):
    """A path that names no file: FileNotFoundError (an OSError with errno ENOENT and the
    path), with or without keyword arguments; a dense snapshot or a file that is not a
    snapshot stays ValueError."""
    import errno
    missing = tmp_path / "nope.qvgs"
    for kw in ({}, kwargs(QUANTS[1])):
        with pytest.raises(FileNotFoundError) as e:
            qt.QVGPackedCausalKVCache.load(missing, **kw)
        assert e.value.errno == errno.ENOENT and e.value.filename == str(missing)
    dense = qt.CausalSelfAttentionKVCache(torch.zeros(B, S, H, D), torch.zeros(B, S, H, D), index_tensor(),
                                          index_tensor())
    with pytest.raises(FileNotFoundError):
        qt.CausalSelfAttentionKVCache.load(missing, k=torch.zeros(B, S, H, D), v=torch.zeros(B, S, H, D),
                                           global_end_index=index_tensor(), local_end_index=index_tensor())
    dense.save(tmp_path / "dense.qvgs")
    with pytest.raises(ValueError, match="holds a dense cache; a packed cache cannot be loaded"):
        qt.QVGPackedCausalKVCache.load(tmp_path / "dense.qvgs")
    (tmp_path / "junk.qvgs").write_bytes(b"not a snapshot at all, just some bytes" * 4)
    with pytest.raises(ValueError):
        qt.QVGPackedCausalKVCache.load(tmp_path / "junk.qvgs")
