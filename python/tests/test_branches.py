"""Branches (issue 38): ``fork()`` of qvg.torch's packed and dense caches.

Every branch is checked against a replay: a cache built fresh and fed the branch's
whole history. Views must be equal bit for bit, the index tensors and int cursors
those of a cache at that state, and the packed cache's byte accounting must show the
shared encoded history (``resident_nbytes() + shared_nbytes()`` is the replay's
``resident_nbytes()``)."""

from __future__ import annotations

import threading

import pytest
import torch

import qvg.torch as qt
from qvg.vllm_omni import LingBotQVGCache

B, H, D, N = 1, 2, 32, 4  # batch, heads, head_dim, tokens per chunk


def _quant(**kw):
    return qt.QVGKVQuantArgs(bits=4, centroids=8, kmeans_iters=2, block_size=16, **kw)


def _packed(device="cpu", **quant):
    return qt.QVGPackedCausalKVCache(batch_size=B, cache_size=8 * N, num_heads=H, head_dim=D, dtype=torch.bfloat16,
                                     device=device, global_end_index=torch.zeros(1, dtype=torch.long),
                                     local_end_index=torch.zeros(1, dtype=torch.long), sink_tokens=N,
                                     quant_args=_quant(**quant))


def _dense(device="cpu"):
    k = torch.zeros(B, 6 * N, H, D, dtype=torch.bfloat16, device=device)
    return qt.CausalSelfAttentionKVCache(k, torch.zeros_like(k), torch.zeros(1, dtype=torch.long, device=device),
                                         torch.zeros(1, dtype=torch.long, device=device), sink_tokens=N)


def _chunk(gen, device="cpu"):
    k = torch.randn(B, N, H, D, generator=gen).to(torch.bfloat16).to(device)
    v = torch.randn(B, N, H, D, generator=gen).to(torch.bfloat16).to(device)
    return k, v


def _call(cache, call):
    k, v, start = call
    return cache.update_and_get_attention_kv(key=k, value=v, current_chunk_start=start)


def _calls(gen, start, chunks, steps=2, device="cpu"):
    """`chunks` chunks from token `start`, each written `steps` times (denoising steps)."""
    out = []
    for c in range(chunks):
        for _ in range(steps):
            k, v = _chunk(gen, device)
            out.append((k, v, start + c * N))
    return out


def _same_view(a, b):
    assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    assert (a.local_start_index, a.local_end_index, a.visible_local_end, a.visible_global_end) == (
        b.local_start_index, b.local_end_index, b.visible_local_end, b.visible_global_end)


def _replay(make, history):
    c = make()
    for call in history:
        _call(c, call)
    return c


@pytest.mark.parametrize("quant", [{}, {"span_mode": "incremental", "span_chunks": 2, "refine_recent": 1}],
                         ids=["deferred", "incremental-refined"])
def test_packed_branches_equal_their_replays(quant):
    gen = torch.Generator().manual_seed(1)
    make = lambda: _packed(**quant)  # noqa: E731
    src = make()
    history = _calls(gen, 0, 6)
    for call in history:
        _call(src, call)
    a, b = src, src.fork()
    assert b is not src and b._c is not src._c
    assert b.global_end_index is not src.global_end_index
    assert int(b.global_end_index) == int(src.global_end_index) == 6 * N
    assert b.snapshot_bytes() == src.snapshot_bytes()
    assert b.shared_nbytes() > 0 and a.shared_nbytes() == b.shared_nbytes()
    hist_a, hist_b = list(history), list(history)
    # Two different continuations: a denoising step then an advance on each.
    for branch, hist in ((a, hist_a), (b, hist_b)):
        for call in _calls(gen, 5 * N, 1) + _calls(gen, 6 * N, 3):
            view = _call(branch, call)
            hist.append(call)
        want = _replay(make, hist)
        _same_view(view, _call(want, hist[-1]))  # the replay's last call once more: the same view
        _same_view(_call(branch, hist[-1]), _call(want, hist[-1]))
        assert branch.resident_nbytes() + branch.shared_nbytes() == want.resident_nbytes()
        assert want.shared_nbytes() == 0
        assert int(branch.global_end_index) == int(want.global_end_index)
    # The sink span (never evicted) stays shared by both branches.
    assert a.shared_nbytes() > 0
    del a, src
    assert b.shared_nbytes() == 0  # the last holder


def test_packed_fork_keeps_int_cursors():
    cache = qt.QVGPackedCausalKVCache(batch_size=B, cache_size=8 * N, num_heads=H, head_dim=D, dtype=torch.bfloat16,
                                      device="cpu", global_end_index=torch.zeros(1, dtype=torch.long),
                                      local_end_index=torch.zeros(1, dtype=torch.long), use_int_indices=True,
                                      quant_args=_quant())
    gen = torch.Generator().manual_seed(2)
    for call in _calls(gen, 0, 3, steps=1):
        _call(cache, call)
    f = cache.fork()
    assert (f.global_end_index_int, f.local_end_index_int) == (3 * N, 3 * N)
    assert int(f.global_end_index) == 0  # with int cursors the tensors are only zeroed, as in the engine


def test_dense_branches_equal_their_replays():
    gen = torch.Generator().manual_seed(3)
    src = _dense()
    history = _calls(gen, 0, 7)  # past the buffer: evictions
    for call in history:
        _call(src, call)
    f = src.fork()
    assert f.k.data_ptr() != src.k.data_ptr() and torch.equal(f.k, src.k)
    assert f.snapshot_bytes() == src.snapshot_bytes()
    for branch in (src, f):
        hist = list(history) + _calls(gen, 6 * N, 1) + _calls(gen, 7 * N, 2)
        want = _replay(_dense, hist)
        for call in hist[len(history):]:
            got = _call(branch, call)
        _same_view(got, _call(want, hist[-1]))
        assert torch.equal(branch.k, want.k) and torch.equal(branch.v, want.v)
        assert (branch.global_end_index_int, branch.local_end_index_int) == (want.global_end_index_int,
                                                                             want.local_end_index_int)
        assert branch.shared_nbytes() == 0


def test_two_threads_one_branch_each():
    gen = torch.Generator().manual_seed(4)
    make = lambda: _packed(span_mode="incremental", span_chunks=2, refine_recent=1)  # noqa: E731
    src = make()
    history = _calls(gen, 0, 4, steps=1)
    for call in history:
        _call(src, call)
    branches = [src.fork(), src.fork()]
    work = [_calls(torch.Generator().manual_seed(10 + t), 3 * N, 30, steps=3) for t in range(2)]
    errors: list[BaseException] = []

    def run(t):
        try:
            replay = _replay(make, history)
            for call in work[t]:
                _same_view(_call(branches[t], call), _call(replay, call))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_lingbot_layer_cache_forks(packed):
    """vLLM-Omni's LingBot-World layer cache (qvg.vllm_omni): two action branches from one
    opening, each equal to a cache that generated its whole history."""
    gen = torch.Generator().manual_seed(6)

    def make():
        return LingBotQVGCache(batch_size=B, max_tokens=6 * N, num_local_heads=H, head_dim=D, device="cpu",
                               dtype=torch.bfloat16, quant_args=_quant() if packed else None)

    def run(cache, calls):
        out = None
        for k, v, start in calls:
            out = cache.update(k, v, start, sink_tokens=N, update_cache=True)
        return out

    opening = _calls(gen, 0, 4)
    src = make()
    run(src, opening)
    f = src.fork()
    assert (f.end, f.absolute_end, f.last_start, f.sink_end) == (src.end, src.absolute_end, src.last_start,
                                                                 src.sink_end)
    for branch in (src, f):
        actions = _calls(gen, 3 * N, 1) + _calls(gen, 4 * N, 4)
        got = run(branch, actions)
        want = run(make(), opening + actions)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # A probe not yet committed: no fork.
    k, v = _chunk(gen)
    f.update(k, v, 8 * N, sink_tokens=N, update_cache=False)
    with pytest.raises(NotImplementedError, match="uncommitted probe"):
        f.fork()


@pytest.mark.skipif(not (qt.HAS_CUDA and torch.cuda.is_available()), reason="needs the CUDA path and a GPU")
def test_cuda_branches_equal_their_replays():
    gen = torch.Generator().manual_seed(5)
    for make in (lambda: _packed("cuda", span_mode="incremental", span_chunks=2, refine_recent=1),
                 lambda: _dense("cuda")):
        src = make()
        history = _calls(gen, 0, 6, device="cuda")
        for call in history:
            _call(src, call)
        f = src.fork()
        hist = history + _calls(gen, 5 * N, 1, device="cuda") + _calls(gen, 6 * N, 2, device="cuda")
        want = _replay(make, hist)
        for branch in (src, f):
            for call in hist[len(history):]:
                got = _call(branch, call)
            _same_view(got, _call(want, hist[-1]))
        assert f.snapshot_bytes() == src.snapshot_bytes()
    # The CUDA dense cache's snapshot: the CPU dense cache's bytes for the same history.
    cpu, dev = _dense(), _dense("cuda")
    hist = _calls(gen, 0, 7)
    for call in hist:
        _call(cpu, call)
        _call(dev, (call[0].cuda(), call[1].cuda(), call[2]))
    assert dev.snapshot_bytes() == cpu.snapshot_bytes()
    back = qt.CausalSelfAttentionKVCache.from_snapshot_bytes(
        dev.snapshot_bytes(), k=torch.zeros_like(dev.k), v=torch.zeros_like(dev.v),
        global_end_index=torch.zeros(1, dtype=torch.long, device="cuda"),
        local_end_index=torch.zeros(1, dtype=torch.long, device="cuda"), sink_tokens=N)
    assert back.k.is_cuda and torch.equal(back.k.cpu(), cpu.k) and torch.equal(back.v.cpu(), cpu.v)
    assert back.snapshot_bytes() == cpu.snapshot_bytes()
