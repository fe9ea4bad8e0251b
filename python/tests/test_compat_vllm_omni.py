"""qvg.vllm_omni against vLLM-Omni's own LingBot-World request-path cache (0.30.0, the
pinned wheel; its transformer module loaded by vllm_omni_shim.py: vLLM itself does not
import here, docs/engines.md).

Random call sequences shaped like LingBot's DMD loop (per block: denoising probes with
``update_cache=False``, then the commit with ``update_cache=True``), with random
geometry, sinks (aligned to chunks or not), a first start other than 0, chunk sizes that
change, and calls the engine refuses. Each call goes to the engine's own
``LingBotSelfAttention._update_cache`` on its ``LingBotAttentionCache`` and to qvg's
cache: the same error (type and message) or the same views bit for bit (dense, and
packed with quantization off), the same cursors, and (dense) the same buffer bytes
after every commit. Calls qvg refuses by design raise NotImplementedError and change
nothing; the engine is then not called either.
"""

from __future__ import annotations

import random

import pytest
import torch

import qvg.torch as qt
import qvg.vllm_omni as qv
import vllm_omni_shim

eng = vllm_omni_shim.load()
ENGINE_UPDATE = eng.LingBotSelfAttention.__dict__["_update_cache"]  # the engine's, before any install()
ENGINE_ALLOCATE = eng.allocate_lingbot_cache


@pytest.fixture(autouse=True)
def _clean():
    qv.uninstall()
    yield
    qv.uninstall()


CURSORS = ("end", "absolute_end", "last_start", "sink_end")


def run_sequence(seed: int, quant_args=None) -> tuple[int, int]:
    """One random sequence; returns (views compared, calls refused by qvg)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    b, h, d = rng.randint(1, 2), rng.randint(1, 3), 8
    chunk = rng.randint(1, 4)
    capacity = chunk * rng.randint(1, 5) + rng.choice((0, 0, rng.randint(0, chunk)))
    sink = rng.choice((0, 0, chunk, rng.randint(0, capacity)))
    dtype = rng.choice((torch.float32, torch.bfloat16, torch.float16))
    ref = eng.LingBotAttentionCache(key=torch.zeros(b, capacity, h, d, dtype=dtype),
                                    value=torch.zeros(b, capacity, h, d, dtype=dtype))
    ours = qv.LingBotQVGCache(batch_size=b, max_tokens=capacity, num_local_heads=h, head_dim=d, device="cpu",
                              dtype=dtype, quant_args=quant_args)
    start = rng.choice((0, 0, 0, rng.randint(1, 6)))
    compared = refused = 0

    def call(at: int, n: int, commit: bool) -> None:
        nonlocal compared, refused
        k = torch.randn(b, n, h, d, generator=gen).to(dtype)
        v = torch.randn(b, n, h, d, generator=gen).to(dtype)
        before = tuple(getattr(ours, f) for f in CURSORS)
        try:
            got = ours.update(k, v, at, sink_tokens=sink, update_cache=commit)
        except NotImplementedError:
            assert tuple(getattr(ours, f) for f in CURSORS) == before
            refused += 1
            return
        except ValueError as e:
            assert tuple(getattr(ours, f) for f in CURSORS) == before
            with pytest.raises(ValueError) as engine_error:
                ENGINE_UPDATE(None, ref, k, v, at, sink_tokens=sink, update_cache=commit)
            assert str(engine_error.value) == str(e)
            return
        want = ENGINE_UPDATE(None, ref, k, v, at, sink_tokens=sink, update_cache=commit)
        where = f"seed {seed}: {n} tokens at {at}, update_cache={commit}"
        for a, g in zip(want, got):
            assert a.shape == g.shape and a.dtype == g.dtype, (where, a.shape, g.shape)
            assert torch.equal(a, g), where
        assert tuple(getattr(ours, f) for f in CURSORS) == tuple(getattr(ref, f) for f in CURSORS), where
        if not ours.packed and ours._pending is None:
            assert torch.equal(ours.key[:, :ref.end], ref.key[:, :ref.end]), where
            assert torch.equal(ours.value[:, :ref.end], ref.value[:, :ref.end]), where
        compared += 1

    for _block in range(rng.randint(1, 8)):
        n = chunk if rng.random() < 0.85 else rng.randint(1, capacity + 1)
        for _probe in range(rng.randint(0, 3)):
            call(start, n, False)
        r = rng.random()
        if r < 0.06 and ref.last_start is not None:  # the last block again (committed or probed)
            call(ref.last_start, ref.absolute_end - ref.last_start, rng.random() < 0.5)
        elif r < 0.1:  # a start the engine refuses
            call(start + rng.choice((-1, 1)), n, True)
        call(start, n, True)
        if ref.last_start == start:
            start += n
    return compared, refused


def test_dense_matches_the_engine_on_1000_sequences():
    compared = refused = 0
    for seed in range(1000):
        c, r = run_sequence(seed)
        compared, refused = compared + c, refused + r
    assert compared > 4000 and refused < compared / 20, (compared, refused)


def test_packed_without_quantization_matches_the_engine_on_1000_sequences():
    compared = refused = 0
    for seed in range(1000, 2000):
        c, r = run_sequence(seed, quant_args=qt.QVGKVQuantArgs())
        compared, refused = compared + c, refused + r
    assert compared > 4000 and refused < compared / 10, (compared, refused)


@pytest.mark.parametrize("flags,bound", [({"kv_cache_quant": "int4"}, 0.08), ({"kv_cache_quant": "int2"}, 0.45)])
def test_packed_quantized_dmd_loop(flags, bound):
    """LingBot's DMD loop (4 probes, then the commit) at 256-token chunks, sink one
    chunk, capacity five: the visible tokens are the engine's in number and order, the
    current chunk exact, the whole view within the codec's error."""
    c, h, d = 256, 2, 64
    ref = eng.LingBotAttentionCache(key=torch.zeros(1, 5 * c, h, d, dtype=torch.bfloat16),
                                    value=torch.zeros(1, 5 * c, h, d, dtype=torch.bfloat16))
    ours = qv.LingBotQVGCache(batch_size=1, max_tokens=5 * c, num_local_heads=h, head_dim=d, device="cpu",
                              dtype=torch.bfloat16, quant_args=flags)
    gen = torch.Generator().manual_seed(3)
    worst = 0.0
    for block in range(7):
        for step in range(5):
            k = torch.randn(1, c, h, d, generator=gen).to(torch.bfloat16)
            want = ENGINE_UPDATE(None, ref, k, k, block * c, sink_tokens=c, update_cache=step == 4)
            got = ours.update(k, k, block * c, sink_tokens=c, update_cache=step == 4)
            assert want[0].shape == got[0].shape
            assert torch.equal(got[0][:, -c:], k)
            worst = max(worst, float((want[0].float() - got[0].float()).norm() / want[0].float().norm()))
        assert (ours.end, ours.absolute_end, ours.sink_end) == (ref.end, ref.absolute_end, ref.sink_end)
    assert 0.0 < worst <= bound, worst
    assert ours.resident_nbytes() < ref.key.nbytes + ref.value.nbytes


def test_refusals_change_nothing():
    ours = qv.LingBotQVGCache(batch_size=1, max_tokens=8, num_local_heads=1, head_dim=8, device="cpu",
                              dtype=torch.float32)
    k = torch.randn(1, 2, 1, 8)
    ours.update(k, k, 0, sink_tokens=0, update_cache=True)
    ours.update(k, k, 2, sink_tokens=0, update_cache=False)  # a probe of the next block
    with pytest.raises(NotImplementedError, match="uncommitted probe"):
        ours.update(k, k, 0, sink_tokens=0, update_cache=True)  # the engine would accept it
    with pytest.raises(NotImplementedError, match="sink_tokens"):
        ours.update(k, k, 2, sink_tokens=2, update_cache=True)
    assert (ours.end, ours.absolute_end, ours.last_start) == (2, 2, 0)
    got = ours.update(k, k, 2, sink_tokens=0, update_cache=True)
    assert torch.equal(got[0], torch.cat((k, k), dim=1)) and ours.end == 4
    packed = qv.LingBotQVGCache(batch_size=1, max_tokens=8, num_local_heads=1, head_dim=8, device="cpu",
                                dtype=torch.float32, quant_args={"kv_cache_quant": "int4",
                                                                 "kv_cache_quant_block_size": 8})
    packed.update(k, k, 0, sink_tokens=0, update_cache=True)
    with pytest.raises(NotImplementedError, match="repeating the last committed start"):
        packed.update(k, k, 0, sink_tokens=0, update_cache=False)
    with pytest.raises(ValueError, match="quant_args"):
        qv.LingBotQVGCache(batch_size=1, max_tokens=8, num_local_heads=1, head_dim=8, device="cpu",
                           dtype=torch.float32, quant_args="int4")


def test_install_serves_the_engine_path_and_uninstall_restores():
    with qv.installed(quant_args={"kv_cache_quant": "int2", "kv_cache_quant_block_size": 8}):
        cache = eng.allocate_lingbot_cache(batch_size=1, num_layers=2, max_tokens=8, num_local_heads=1, head_dim=8,
                                           device=torch.device("cpu"), dtype=torch.float32)
        assert isinstance(cache, eng.LingBotTransformerCache) and cache.cross_attention == [None, None]
        assert all(isinstance(c, qv.LingBotQVGCache) and c.packed for c in cache.self_attention)
        k = torch.randn(1, 4, 1, 8)
        got = eng.LingBotSelfAttention._update_cache(None, cache.self_attention[0], k, k, 0, sink_tokens=0,
                                                     update_cache=True)
        assert torch.equal(got[0], k) and cache.self_attention[0].end == 4
        # the engine's own cache still goes to the engine's method
        own = eng.LingBotAttentionCache(key=torch.zeros(1, 8, 1, 8), value=torch.zeros(1, 8, 1, 8))
        eng.LingBotSelfAttention._update_cache(None, own, k, k, 0, sink_tokens=0, update_cache=True)
        assert own.end == 4 and torch.equal(own.key[:, :4], k)
        qv.install()  # new settings replace the old
        dense = eng.allocate_lingbot_cache(batch_size=1, num_layers=1, max_tokens=8, num_local_heads=1, head_dim=8,
                                           device=torch.device("cpu"), dtype=torch.float32)
        assert not dense.self_attention[0].packed
    assert eng.allocate_lingbot_cache is ENGINE_ALLOCATE and not qv.is_installed()
    assert eng.LingBotSelfAttention.__dict__["_update_cache"] is ENGINE_UPDATE
