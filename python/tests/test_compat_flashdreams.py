"""qvg.flashdreams.BlockKVCache against flashdreams' own BlockKVCache (0.1.0, the pinned
wheel; docs/engines.md): random sequences of the runners' protocol (before_update /
update x denoising steps / cached_k, cached_v / after_update, repeated chunks, reset),
random layouts (seq_dim anywhere but the last dimension), sinks and windows.

Dense: every view, size and write_end equal flashdreams' bit for bit (shape, strides,
values). Packed with quantization off: the same views bit for bit. Packed int4 / int2:
the current chunk exact, the rest within the codec's error. Plus install() and the
refusal of CUDA graph capture.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import random
import sys
import types

import pytest
import torch

import qvg.flashdreams as qf
import qvg.torch as qt
from compat_common import import_engine

fd_kvcache = import_engine("flashdreams.core.attention.kvcache")
fd_attention = importlib.import_module("flashdreams.core.attention")
FD = fd_kvcache.BlockKVCache

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(autouse=True)
def _clean():
    qf.uninstall()
    yield
    qf.uninstall()


def random_config(rng: random.Random) -> dict:
    ndim = rng.choice((3, 4, 4, 5))
    chunk = rng.randint(1, 4)
    sink = rng.choice((0, 0, rng.randint(1, 6)))
    # window >= chunk and (sink + window) % chunk == 0
    window = chunk * rng.randint(1, 4) + (-sink) % chunk
    seq_dim = rng.randrange(ndim - 1)
    shape = [rng.randint(1, 3) for _ in range(ndim)]
    shape[seq_dim] = sink + window
    shape[-1] = rng.choice((4, 8))
    if rng.random() < 0.5:
        seq_dim -= ndim  # negative seq_dim, as the recipes use (-3)
    return dict(k_shape=tuple(shape), v_shape=tuple(shape), seq_dim=seq_dim, chunk_size=chunk, window_size=window,
                sink_size=sink, device="cpu", dtype=rng.choice(DTYPES))


def chunk_tensor(cfg: dict, gen: torch.Generator) -> torch.Tensor:
    shape = list(cfg["k_shape"])
    shape[cfg["seq_dim"]] = cfg["chunk_size"]
    return torch.randn(shape, generator=gen)  # float32: both caches cast it to their dtype


def run_sequence(seed: int, quant_args=None, check_strides: bool = True) -> int:
    """One random sequence on flashdreams' cache and qvg's; returns the views compared."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    cfg = random_config(rng)
    ref = FD(**cfg)
    ours = qf.BlockKVCache(**cfg, quant_args=quant_args)
    compared = 0

    def check(where: str) -> None:
        nonlocal compared
        assert ours.size == ref.size and ours.write_end == ref.write_end, where
        assert ours.is_steady_state() == ref.is_steady_state(), where
        for a, b in ((ref.cached_k(), ours.cached_k()), (ref.cached_v(), ours.cached_v())):
            assert a.shape == b.shape and a.dtype == b.dtype, (where, a.shape, b.shape)
            assert torch.equal(a, b), where
            if check_strides:
                assert a.stride() == b.stride(), where
        compared += 1

    idx = 0
    for step in range(rng.randint(1, 9)):
        if step and rng.random() < 0.08:
            ref.reset()
            ours.reset()
            idx = 0
        repeat = idx > 0 and rng.random() < 0.25
        chunk_idx = idx - 1 if repeat else idx
        ref.before_update(chunk_idx)
        ours.before_update(chunk_idx)
        if repeat and rng.random() < 0.5:
            check(f"seed {seed} chunk {chunk_idx} repeated, before update")  # update_kv_cache=False
        for _ in range(rng.randint(0 if repeat else 1, 3)):  # denoising steps rewrite the chunk
            k, v = chunk_tensor(cfg, gen), chunk_tensor(cfg, gen)
            ref.update(k, v)
            ours.update(k, v)
            check(f"seed {seed} chunk {chunk_idx}")
        ref.after_update(chunk_idx)
        ours.after_update(chunk_idx)
        assert (ours.size, ours._n_cached, ours._prev_chunk_idx) == (ref.size, ref._n_cached, ref._prev_chunk_idx)
        if not repeat:
            idx += 1
    return compared


def test_dense_matches_flashdreams_bit_for_bit_on_1000_sequences():
    compared = sum(run_sequence(seed) for seed in range(1000))
    assert compared > 3000


def test_packed_without_quantization_matches_flashdreams_on_1000_sequences():
    compared = sum(run_sequence(seed, quant_args=qt.QVGKVQuantArgs(), check_strides=False)
                   for seed in range(1000, 2000))
    assert compared > 3000


def test_a_one_ulp_change_is_seen():
    """The comparison above sees one ulp in one element of one view."""
    cfg = dict(k_shape=(1, 4, 2, 8), v_shape=(1, 4, 2, 8), seq_dim=1, chunk_size=2, window_size=4, device="cpu",
               dtype=torch.bfloat16)
    ref, ours = FD(**cfg), qf.BlockKVCache(**cfg)
    k = torch.randn(1, 2, 2, 8)
    for c in (ref, ours):
        c.before_update(0)
        c.update(k, k)
    assert torch.equal(ref.cached_k(), ours.cached_k())
    view = ours.cached_k()
    view.view(torch.int16)[0, 1, 1, 3] += 1  # one ulp of one bfloat16 element, in the cache's buffer
    assert not torch.equal(ref.cached_k(), ours.cached_k())


@pytest.mark.parametrize("flags,bound", [({"kv_cache_quant": "int4"}, 0.08), ({"kv_cache_quant": "int2"}, 0.45),
                                         ({"kv_cache_quant": "int2", "kv_cache_quant_profile": "hq"}, 0.22)])
def test_packed_quantized_views(flags, bound):
    """Packed int4 / int2 over flashdreams' Wan layout [B, S, H, D] (seq_dim -3): the same
    visible tokens as flashdreams' cache, the current chunk exact, the relative L2
    error of the whole view within the codec's bound (measured: int4 0.052, int2 0.34,
    int2 hq 0.16 on Gaussian data), and fewer resident bytes than the dense buffers."""
    c = 256  # more tokens than the 128 centroids: fewer and each token is its own centroid (exact)
    cfg = dict(k_shape=(1, 5 * c, 2, 64), v_shape=(1, 5 * c, 2, 64), seq_dim=-3, chunk_size=c, window_size=4 * c,
               sink_size=c, device="cpu", dtype=torch.bfloat16)
    ref = FD(**cfg)
    ours = qf.BlockKVCache(**cfg, quant_args=flags)
    gen = torch.Generator().manual_seed(7)
    worst = 0.0
    for i in range(7):
        ref.before_update(i)
        ours.before_update(i)
        for _ in range(1 + (i == 5)):
            k, v = torch.randn(1, c, 2, 64, generator=gen), torch.randn(1, c, 2, 64, generator=gen)
            ref.update(k, v)
            ours.update(k, v)
            for a, b in ((ref.cached_k(), ours.cached_k()), (ref.cached_v(), ours.cached_v())):
                assert a.shape == b.shape == (1, ref.size, 2, 64)
                assert torch.equal(a[:, -c:], b[:, -c:])  # the current chunk is raw
                err = float((a.float() - b.float()).norm() / a.float().norm())
                worst = max(worst, err)
        ref.after_update(i)
        ours.after_update(i)
    assert 0.0 < worst <= bound, worst
    assert ours.resident_nbytes() < 2 * ref._k.nbytes


def test_errors_are_typed_and_change_nothing():
    cfg = dict(k_shape=(1, 6, 2, 8), v_shape=(1, 6, 2, 8), seq_dim=1, chunk_size=2, window_size=4, sink_size=2,
               device="cpu", dtype=torch.float32)
    with pytest.raises(NotImplementedError, match="window_size"):
        qf.BlockKVCache(**{**cfg, "chunk_size": 3, "window_size": 1, "k_shape": (1, 3, 2, 8),
                           "v_shape": (1, 3, 2, 8), "sink_size": 2})
    with pytest.raises(NotImplementedError, match="head dimension"):
        qf.BlockKVCache(**{**cfg, "v_shape": (1, 6, 2, 4)})
    with pytest.raises(ValueError, match="divisible"):
        qf.BlockKVCache(**{**cfg, "chunk_size": 4})
    with pytest.raises(ValueError, match="quant_args"):
        qf.BlockKVCache(**cfg, quant_args="int4")
    cache = qf.BlockKVCache(**cfg)
    with pytest.raises(RuntimeError, match="before_update"):
        cache.cached_k()
    with pytest.raises(ValueError, match="chunk_idx must be 0"):
        cache.before_update(1)
    cache.before_update(0)
    with pytest.raises(RuntimeError, match="before update"):
        cache.cached_k()  # a new chunk's tokens are not written yet
    with pytest.raises(ValueError, match="shape"):
        cache.update(torch.zeros(1, 3, 2, 8), torch.zeros(1, 3, 2, 8))
    with pytest.raises(ValueError):
        cache.update(torch.full((1, 2, 2, 8), float("nan")), torch.zeros(1, 2, 2, 8))
    with pytest.raises(RuntimeError, match="never written"):
        cache.after_update(0)
    assert cache.size == 2 and cache._n_cached == 0
    k = torch.randn(1, 2, 2, 8)
    cache.update(k, k)
    assert torch.equal(cache.cached_k(), k)


def test_cuda_graph_capture_is_refused(monkeypatch):
    """use_cuda_graph=True: a call during capture raises NotImplementedError naming the
    switch, and changes nothing (simulated capture: no GPU here)."""
    cfg = dict(k_shape=(1, 4, 1, 8), v_shape=(1, 4, 1, 8), seq_dim=1, chunk_size=2, window_size=4, device="cpu",
               dtype=torch.float32)
    for quant in (None, {"kv_cache_quant": "int4", "kv_cache_quant_block_size": 8}):
        cache = qf.BlockKVCache(**cfg, quant_args=quant)
        cache.before_update(0)
        k = torch.randn(1, 2, 1, 8)
        cache.update(k, k)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        for call in (lambda: cache.update(k + 1, k + 1), cache.cached_k, cache.cached_v):
            with pytest.raises(NotImplementedError, match="use_cuda_graph=False"):
                call()
        monkeypatch.undo()
        assert torch.equal(cache.cached_k(), k)


# ---------------------------------------------------------------------------
# install()
# ---------------------------------------------------------------------------


def test_every_import_site_in_the_wheel_is_covered():
    """Every module of the pinned wheel that imports BlockKVCache does so from
    flashdreams.core.attention or its kvcache module, whose names install() rebinds
    (the experimental module defines its own, other class: not replaced)."""
    dist = importlib.metadata.distribution("flashdreams")
    sites = {}
    for f in dist.files:
        if not str(f).endswith(".py"):
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and any(a.name == "BlockKVCache" for a in node.names):
                sites[str(f)] = node.module
    assert set(sites.values()) <= {"flashdreams.core.attention", "flashdreams.core.attention.kvcache",
                                   "flashdreams.core.experimental.kvcache"}, sites
    assert len([m for m in sites.values() if m != "flashdreams.core.experimental.kvcache"]) >= 4, sites


def test_install_rebinds_and_uninstall_restores():
    late = types.ModuleType("flashdreams._qvg_test_recipe")
    sys.modules[late.__name__] = late
    try:
        exec("from flashdreams.core.attention import BlockKVCache", late.__dict__)  # as the recipes import it
        assert late.BlockKVCache is FD
        cls = qf.install()
        assert cls is qf.BlockKVCache and qf.is_installed()
        assert fd_kvcache.BlockKVCache is cls and fd_attention.BlockKVCache is cls and late.BlockKVCache is cls
        from flashdreams.core.attention import BlockKVCache as fresh
        assert fresh is cls
        packed = qf.install(quant_args={"kv_cache_quant": "int2", "kv_cache_quant_block_size": 8})  # new settings replace the old
        assert fd_attention.BlockKVCache is packed and late.BlockKVCache is packed and issubclass(packed, cls)
        cache = fd_attention.BlockKVCache(k_shape=(1, 4, 1, 8), v_shape=(1, 4, 1, 8), seq_dim=-3, chunk_size=2,
                                          window_size=4, device="cpu", dtype=torch.float32)
        assert cache.packed and cache.quant_args.bits == 2
        text = fd_attention.BlockKVCache.from_tensor(torch.ones(1, 3, 1, 8), torch.ones(1, 3, 1, 8), seq_dim=-3)
        assert not text.packed and torch.equal(text.cached_k(), torch.ones(1, 3, 1, 8))  # context caches: dense
        qf.uninstall()
        assert fd_kvcache.BlockKVCache is FD and fd_attention.BlockKVCache is FD and late.BlockKVCache is FD
        with pytest.raises(KeyError):
            with qf.installed():
                assert fd_attention.BlockKVCache is qf.BlockKVCache
                raise KeyError("boom")
        assert fd_attention.BlockKVCache is FD and not qf.is_installed()
    finally:
        del sys.modules[late.__name__]


def test_from_tensor_matches_flashdreams():
    k, v = torch.randn(2, 5, 3, 8), torch.randn(2, 5, 3, 8)
    ref, ours = FD.from_tensor(k, v, seq_dim=-3), qf.BlockKVCache.from_tensor(k, v, seq_dim=-3)
    for a, b in ((ref.cached_k(), ours.cached_k()), (ref.cached_v(), ours.cached_v())):
        assert torch.equal(a, b) and a.stride() == b.stride()
    assert ours.size == ref.size == 5
