"""CUDA tensors in qvg.torch (docs/python.md, "CUDA tensors"): the GPU tests.

They need a CUDA device and qvg._C built with its CUDA path, and are skipped
otherwise (as on the CPU machines and in CI, which only compile that path).
scripts/gpu-check runs them on a GPU machine (its verdict's pytest_cuda step;
docs/cuda.md). What they check:

* CUDA caches vs CPU caches, bit for bit, quantization off, over random call
  sequences (rolling and eviction lifecycles, unaligned sinks, recent windows,
  head slices), dense and packed;
* int2: the device view's packed tokens equal the CPU decoder's decode of the same
  (downloaded) encodings, bit for bit (spec 1.3), with init random and kmeans++;
* torch.cuda.memory_allocated() grows by resident_nbytes() + view_buffer_nbytes(),
  each allocation rounded up to the caching allocator's 512-byte blocks plus the
  256-byte alignment of the encoded arrays (the tolerance: allocated_nbytes() is the
  exact padded size, + < 512 bytes per allocation), plus one block per cache for the
  device input check's flags; empty_cache() returns it;
* a model of packed caches holds one view window at a time (the copied view owns its
  buffer), and a view kept across the next update keeps its bytes;
* a view consumed on a side stream after wait_stream is correct; a cache works on
  a non-default current stream and (two GPUs) on a device other than the current one;
* spec 5 device errors (ValueError naming both devices, nothing changes),
  torch.OutOfMemoryError with the cache unchanged, a capture of the first update
  and of an advance refused, torch.compile with a graph break.
"""

from __future__ import annotations

import gc
import random

import pytest
import torch

import qvg.torch as qt
from conftest import bits_equal, index_tensor
from test_equivalence import plan_calls

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not qt.HAS_CUDA, reason="qvg._C was built without its CUDA path (docs/python.md)"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]

BLOCK = 512  # the caching allocator's size granularity (bytes)


def dense_pair(B, cap, H, D, dtype, sink=0, window=0, growth=False):
    """A CPU dense cache and a CUDA one with equal (zero) buffers."""
    out = []
    for device in ("cpu", "cuda"):
        k = torch.zeros(B, cap, H, D, dtype=dtype, device=device)
        out.append(qt.CausalSelfAttentionKVCache(
            k=k, v=torch.zeros_like(k), global_end_index=index_tensor(), local_end_index=index_tensor(),
            cache_size=cap, sink_tokens=sink, attention_window_size=window, allow_growth=growth))
    return out


def packed(device, B, cap, H, D, dtype, sink=0, window=None, quant=None, ints=False):
    return qt.QVGPackedCausalKVCache(
        batch_size=B, cache_size=cap, num_heads=H, head_dim=D, dtype=dtype, device=device,
        global_end_index=index_tensor(), local_end_index=index_tensor(), use_int_indices=ints, sink_tokens=sink,
        attention_window_size=window, quant_args=quant if quant is not None else qt.QVGKVQuantArgs())


def same_view(cpu_view, cuda_view) -> bool:
    return (bits_equal(cpu_view.k, cuda_view.k.cpu()) and bits_equal(cpu_view.v, cuda_view.v.cpu())
            and (cpu_view.local_start_index, cpu_view.local_end_index, cpu_view.visible_local_end,
                 cpu_view.visible_global_end) == (cuda_view.local_start_index, cuda_view.local_end_index,
                                                  cuda_view.visible_local_end, cuda_view.visible_global_end))


@pytest.mark.parametrize("kind", ["rolling", "eviction"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("sink", [0, 5])
@pytest.mark.parametrize("head_slices", [1, 2])
def test_cuda_caches_equal_cpu_caches_bit_for_bit(kind, dtype, sink, head_slices):
    B, H, D, cap = 2, 4, 16, 24
    rng = random.Random(sink * 10 + head_slices)
    gen = torch.Generator().manual_seed(3)
    cpu_dense, cuda_dense = dense_pair(B, cap, H, D, dtype, sink=sink)
    cpu_packed, cuda_packed = (packed(d, B, cap, H, D, dtype, sink=sink) for d in ("cpu", "cuda"))
    slices = [(0, H)] if head_slices == 1 else [(0, H // 2), (H // 2, H // 2)]
    calls = plan_calls(kind, rng, cap, sink, "mixed", n_chunks=12)
    for c, n, rw in calls:
        for hs, h in slices:
            key = torch.randn(B, n, h, D, generator=gen).to(dtype)
            value = (torch.randn(B, n, h, D, generator=gen) * 3).to(dtype)
            args = dict(current_chunk_start=c, cache_head_start=None if h == H else hs, recent_window_tokens=rw)
            for cpu_cache, cuda_cache in ((cpu_dense, cuda_dense), (cpu_packed, cuda_packed)):
                cv = cpu_cache.update_and_get_attention_kv(key=key, value=value, **args)
                gv = cuda_cache.update_and_get_attention_kv(key=key.cuda(), value=value.cuda(), **args)
                assert gv.k.is_cuda and gv.v.is_cuda
                assert same_view(cv, gv), (type(cpu_cache).__name__, c, n, rw, hs)
                assert cv.zero_copy == gv.zero_copy
    assert bits_equal(cpu_dense.k, cuda_dense.k.cpu()) and bits_equal(cpu_dense.v, cuda_dense.v.cpu())
    assert cpu_packed.resident_nbytes() == cuda_packed.resident_nbytes()


def test_cuda_dense_growth_equals_cpu():
    cpu, gpu = dense_pair(1, 8, 2, 8, torch.float32, growth=True)
    gen = torch.Generator().manual_seed(1)
    for c in range(0, 40, 4):
        x = torch.randn(1, 4, 2, 8, generator=gen)
        cv = cpu.update_and_get_attention_kv(key=x, value=-x, current_chunk_start=c)
        gv = gpu.update_and_get_attention_kv(key=x.cuda(), value=-x.cuda(), current_chunk_start=c)
        assert same_view(cv, gv)
    assert gpu.cache_size == cpu.cache_size > 8 and gpu.k.is_cuda
    assert bits_equal(cpu.k, gpu.k.cpu())


def view_row(g, ge, sink, window):
    """The view row of global token g (spec 4 window, recent_window_tokens absent), or -1."""
    se = min(sink, ge)
    tail = max(se, ge - max(0, window - se))
    if tail <= se or g < se:
        return g
    return se + (g - tail) if g >= tail else -1


@pytest.mark.parametrize("asymmetric,init", [(False, "random"), (True, "random"), (False, "kmeans++")])
def test_int2_view_equals_cpu_decode_of_the_device_encodings(asymmetric, init):
    B, H, D, chunk, cap, sink = 1, 4, 64, 32, 8 * 32, 32
    quant = qt.QVGKVQuantArgs(bits=2, centroids=16, block_size=32, asymmetric=asymmetric, init=init)
    cache = packed("cuda", B, cap, H, D, torch.bfloat16, sink=sink, quant=quant)
    gen = torch.Generator().manual_seed(9)
    checked = 0
    for c in range(0, 12 * chunk, chunk):
        x = (torch.randn(2, B, chunk, H, D, generator=gen) * 4 + torch.arange(H).view(1, 1, 1, H, 1)).bfloat16()
        view = cache.update_and_get_attention_kv(key=x[0].cuda(), value=x[1].cuda(), current_chunk_start=c)
        vk, vv = view.k.cpu(), view.v.cpu()
        ge = view.visible_global_end
        for i, seg in enumerate(cache._segments()):
            if not seg["packed"]:
                continue
            hk, hv = cache._c.segment_on_host(i)  # the CPU decoder's decode of the downloaded encodings
            for t, g in enumerate(range(seg["g0"], seg["g1"])):
                row = view_row(g, ge, sink, cap)
                if row < 0:
                    continue
                assert bits_equal(vk[:, row], hk[:, t]) and bits_equal(vv[:, row], hv[:, t]), (c, i, g)
                checked += 1
    assert checked > 0


def test_memory_allocated_counts_resident_and_view_buffer():
    torch.cuda.synchronize()
    gc.collect()
    B, H, D, chunk = 1, 4, 64, 64
    gen = torch.Generator().manual_seed(2)
    inputs = [(torch.randn(2, B, chunk, H, D, generator=gen)).bfloat16().cuda() for _ in range(10)]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    quant = qt.QVGKVQuantArgs(bits=2, centroids=16, block_size=32)
    cache = packed("cuda", B, 8 * chunk, H, D, torch.bfloat16, sink=chunk, quant=quant)
    for i, x in enumerate(inputs):
        view = cache.update_and_get_attention_kv(key=x[0], value=x[1], current_chunk_start=i * chunk)
        del view  # not held across calls: no private copies
        torch.cuda.synchronize()
        delta = torch.cuda.memory_allocated() - base
        # the arrays with their alignment, and the input check's flags (24 bytes: one block)
        exact = cache._c.allocated_nbytes() + cache.view_buffer_nbytes() + BLOCK
        allocations = 2 * len(cache._segments()) + (1 if cache.view_buffer_nbytes() else 0)
        assert cache.resident_nbytes() + cache.view_buffer_nbytes() <= exact
        assert exact <= delta < exact + BLOCK * allocations, (i, delta, exact, allocations)
    reserved = torch.cuda.memory_reserved()
    del cache
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() < reserved


def test_a_model_of_packed_caches_holds_one_view_window_at_a_time():
    """Issue 37: a packed cache's copied view owns its memory (the cache hands its
    buffer over), so L layers that drop each view after their attention, as a model
    does, hold no view between calls (one window at a time, not L): the memory
    allocated after each chunk is the caches' state exactly (plus a view the test
    keeps); and a view kept across later updates keeps its bytes without a copy."""
    torch.cuda.synchronize()
    gc.collect()
    base = torch.cuda.memory_allocated()
    B, H, D, chunk, layers = 1, 4, 64, 256, 6
    quant = qt.QVGKVQuantArgs(bits=2, centroids=16, block_size=32)
    caches = [packed("cuda", B, 8 * chunk, H, D, torch.bfloat16, sink=chunk, quant=quant) for _ in range(layers)]
    gen = torch.Generator().manual_seed(12)
    kept = kept_bytes = None
    copied = 0
    for c in range(10):
        x = torch.randn(2, B, chunk, H, D, generator=gen).bfloat16().cuda()
        for i, cache in enumerate(caches):
            view = cache.update_and_get_attention_kv(key=x[0], value=x[1], current_chunk_start=c * chunk)
            copied += not view.zero_copy
            assert cache.view_buffer_nbytes() == 0  # a copied view's memory is the caller's
            if i == 0 and c == 5:
                kept, kept_bytes = view, (view.k.cpu(), view.v.cpu())
            del view
        del x
        torch.cuda.synchronize()
        delta = torch.cuda.memory_allocated() - base
        exact = sum(cache._c.allocated_nbytes() + BLOCK for cache in caches)  # + each one's input-check flags
        allocations = sum(2 * len(cache._segments()) for cache in caches)
        if kept is not None:
            exact += kept.k.nbytes + kept.v.nbytes  # one buffer, K then V
            allocations += 1
        assert exact <= delta < exact + BLOCK * allocations, (c, delta, exact, allocations)
    assert copied > layers * 5
    assert torch.equal(kept.k.cpu(), kept_bytes[0]) and torch.equal(kept.v.cpu(), kept_bytes[1])


def test_view_consumed_on_a_side_stream():
    B, H, D, chunk = 1, 2, 64, 256
    cpu_cache = packed("cpu", B, 4 * chunk, H, D, torch.float16, sink=chunk)
    cuda_cache = packed("cuda", B, 4 * chunk, H, D, torch.float16, sink=chunk)
    side = torch.cuda.Stream()
    gen = torch.Generator().manual_seed(4)
    for c in range(0, 6 * chunk, chunk):
        x = torch.randn(2, B, chunk, H, D, generator=gen).half()
        cv = cpu_cache.update_and_get_attention_kv(key=x[0], value=x[1], current_chunk_start=c)
        gv = cuda_cache.update_and_get_attention_kv(key=x[0].cuda(), value=x[1].cuda(), current_chunk_start=c)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            k_copy = gv.k.clone()  # read on the side stream
            v_copy = gv.v.clone()
        torch.cuda.current_stream().wait_stream(side)
        side.synchronize()
        assert bits_equal(cv.k, k_copy.cpu()) and bits_equal(cv.v, v_copy.cpu()), c


def test_non_default_current_stream():
    cpu_dense, cuda_dense = dense_pair(1, 32, 2, 8, torch.float32, sink=4)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())  # the buffers were zero-filled on the current stream
    gen = torch.Generator().manual_seed(6)
    with torch.cuda.stream(s):
        for c in range(0, 64, 8):
            x = torch.randn(1, 8, 2, 8, generator=gen)
            cv = cpu_dense.update_and_get_attention_kv(key=x, value=x, current_chunk_start=c, recent_window_tokens=4)
            gv = cuda_dense.update_and_get_attention_kv(key=x.cuda(), value=x.cuda(), current_chunk_start=c,
                                                        recent_window_tokens=4)
            assert same_view(cv, gv)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_cache_on_a_device_that_is_not_current():
    torch.cuda.set_device(0)
    cpu = packed("cpu", 1, 32, 2, 8, torch.float32, sink=8)
    gpu = packed("cuda:1", 1, 32, 2, 8, torch.float32, sink=8)
    k1 = torch.zeros(1, 32, 2, 8, device="cuda:1")
    cpu_dense = dense_pair(1, 32, 2, 8, torch.float32, sink=8)[0]
    gpu_dense = qt.CausalSelfAttentionKVCache(k=k1, v=torch.zeros_like(k1), global_end_index=index_tensor(),
                                              local_end_index=index_tensor(), sink_tokens=8)
    gen = torch.Generator().manual_seed(8)
    for c in range(0, 64, 8):
        x = torch.randn(1, 8, 2, 8, generator=gen)
        for cc, gc_ in ((cpu, gpu), (cpu_dense, gpu_dense)):
            cv = cc.update_and_get_attention_kv(key=x, value=x, current_chunk_start=c)
            gv = gc_.update_and_get_attention_kv(key=x.to("cuda:1"), value=x.to("cuda:1"), current_chunk_start=c)
            assert gv.k.device == torch.device("cuda:1") and same_view(cv, gv)
        assert torch.cuda.current_device() == 0


def test_held_view_keeps_its_values():
    """A CUDA view still referenced at the next call keeps its values: a copied view owns
    its buffer, the current chunk's zero-copy view gets a private copy (never dangles)."""
    cache = packed("cuda", 1, 16, 2, 8, torch.float32, sink=4)
    x = torch.ones(1, 4, 2, 8, device="cuda")
    held = []
    for c in range(0, 40, 4):
        view = cache.update_and_get_attention_kv(key=x * c, value=-x * c, current_chunk_start=c)
        held.append((view, view.k.cpu(), view.v.cpu()))
    for view, k, v in held:
        assert bits_equal(view.k.cpu(), k) and bits_equal(view.v.cpu(), v)


def same_state(a, b) -> bool:
    """Equal debug states: the CPU caches' (comparable objects) or the CUDA caches'
    (tuples, the dense one holding host copies of its buffers)."""
    if not isinstance(a, tuple):
        return a == b
    return len(a) == len(b) and all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


def test_device_mismatch_is_a_value_error_naming_both_devices():
    gpu_packed = packed("cuda", 1, 16, 2, 8, torch.float32)
    cpu_packed = packed("cpu", 1, 16, 2, 8, torch.float32)
    cpu_dense, gpu_dense = dense_pair(1, 16, 2, 8, torch.float32)
    x = torch.ones(1, 4, 2, 8)
    dev = f"cuda:{torch.cuda.current_device()}"
    cases = [
        (gpu_packed, x, x, rf"^key must be on the cache's device {dev}, got cpu$"),
        (gpu_packed, x.cuda(), x, rf"^value must be on the cache's device {dev}, got cpu$"),
        (cpu_packed, x.cuda(), x.cuda(), rf"^key must be on the cache's device cpu, got {dev}$"),
        (gpu_dense, x, x.cuda(), rf"^key must be on the cache's device {dev}, got cpu$"),
        (cpu_dense, x, x.cuda(), rf"^value must be on the cache's device cpu, got {dev}$"),
    ]
    for cache, key, value, msg in cases:
        before = cache._c.debug_state()
        with pytest.raises(ValueError, match=msg):
            cache.update_and_get_attention_kv(key=key, value=value, current_chunk_start=0)
        assert same_state(cache._c.debug_state(), before)
    with pytest.raises(ValueError, match=rf"^v must be on the cache's device {dev}, got cpu$"):
        qt.CausalSelfAttentionKVCache(k=torch.zeros(1, 8, 2, 8, device="cuda"), v=torch.zeros(1, 8, 2, 8),
                                      global_end_index=index_tensor(), local_end_index=index_tensor())


def test_cuda_errors_have_the_cpu_messages():
    """An argument error is raised by the call itself, with the CPU cache's message. A
    value out of spec 1's limits is checked on the device without waiting (docs/cuda.md,
    "update() does not wait"): check() (or the next call) raises the CPU's ValueError,
    naming the bad call's chunk, once."""
    gpu = packed("cuda", 1, 16, 2, 8, torch.float32, sink=4)
    cpu = packed("cpu", 1, 16, 2, 8, torch.float32, sink=4)
    bad = torch.ones(1, 4, 2, 8)
    bad[0, 2, 1, 3] = float("nan")
    with pytest.raises(ValueError) as e:
        cpu.update_and_get_attention_kv(key=bad, value=bad, current_chunk_start=0)
    cpu_msg = str(e.value)
    gpu.update_and_get_attention_kv(key=bad.cuda(), value=bad.cuda(), current_chunk_start=0)  # returns at once
    with pytest.raises(ValueError) as e:
        gpu.check()
    gpu_msg, core = str(e.value), "key must hold finite values with |x| <= 1e16, got nan at [0, 2, 1, 3]"
    assert core in cpu_msg and core in gpu_msg and "the update() of chunk [0, 4)" in gpu_msg, (cpu_msg, gpu_msg)
    gpu.check()  # reported once
    msgs = []  # fresh caches: the bad call above advanced the CUDA cache (its rows zeros), not the CPU one
    for cache, dev in ((packed("cpu", 1, 16, 2, 8, torch.float32, sink=4), "cpu"),
                       (packed("cuda", 1, 16, 2, 8, torch.float32, sink=4), "cuda")):
        with pytest.raises(RuntimeError) as e:
            key = torch.ones(1, 17, 2, 8, device=dev)
            cache.update_and_get_attention_kv(key=key, value=key, current_chunk_start=0)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]


def test_out_of_memory_raises_torch_oom_and_changes_nothing():
    B, H, D, chunk = 1, 8, 128, 4096
    cache = packed("cuda", B, 4 * chunk, H, D, torch.bfloat16)
    x = torch.randn(B, chunk, H, D, device="cuda").bfloat16()
    cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=0)
    before = cache._c.debug_state()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # no cached block may serve the next allocations
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    # Room for what the allocator holds now plus less than one new chunk's K buffer.
    limit = (torch.cuda.memory_reserved() + x.nbytes // 2) / total
    torch.cuda.set_per_process_memory_fraction(limit)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=chunk)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert cache._c.debug_state() == before
    view = cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=chunk)  # the same call now works
    assert view.visible_global_end == 2 * chunk


def test_cuda_graph_capture_refuses_what_a_graph_cannot_hold():
    """A capture of a cache's first update() (it allocates the pinned check record) and
    of an advance to a new chunk (it would free older chunks, allocated before the
    capture) raise NotImplementedError before any change; outside the capture both
    calls work. (Captured steps of the same size are replayed by qvg_gpu_tests'
    graph_captured_* tests.)"""
    cache = packed("cuda", 1, 16, 2, 8, torch.float32)
    x = torch.ones(1, 4, 2, 8, device="cuda")
    with pytest.raises(NotImplementedError, match="before capturing"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=0)
    assert cache._c.global_end == 0
    assert cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=0).visible_global_end == 4
    with pytest.raises(NotImplementedError, match="advance the cache"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=4)
    assert cache._c.global_end == 4
    assert cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=4).visible_global_end == 8


def test_torch_compile_with_a_graph_break():
    eager = packed("cuda", 1, 64, 2, 8, torch.float32, sink=8)
    compiled_cache = packed("cuda", 1, 64, 2, 8, torch.float32, sink=8)

    def step(cache, q, k, v, c):
        view = cache.update_and_get_attention_kv(key=k, value=v, current_chunk_start=c)
        return (q.sum(dim=1, keepdim=True) * view.k).sum(dim=1) + view.v.mean()

    compiled = torch.compile(step, backend="eager")
    gen = torch.Generator().manual_seed(5)
    for c in range(0, 32, 8):
        q, k, v = (torch.randn(1, 8, 2, 8, generator=gen).cuda() for _ in range(3))
        assert torch.equal(step(eager, q, k, v, c), compiled(compiled_cache, q, k, v, c))
