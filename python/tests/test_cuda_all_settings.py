"""qvg.torch's CUDA packed cache with every setting of the CPU cache (docs/cuda.md),
and snapshots between CPU and CUDA caches.

The GPU tests (marked gpu) need a CUDA device and qvg._C built with its CUDA path;
scripts/gpu-check runs this file in its optional second part (not in the verdict).
What they check:

* the every-setting profile (incremental spans of 4 with adaptive breaks, 2 x 2-bit
  refinement layers, keep_recent 1, sink_keep 1, init warm, scale_search mse, K at
  int4 and V at int2) on a CUDA cache: the same segment geometry as the CPU cache fed
  the same inputs, resident_nbytes() equal to the CPU cache's (no breaks), and every
  packed view token equal bit for bit to the CPU decode of the segment the device
  holds (span codebook and refinement layers included: segment_on_host);
* a CPU cache's snapshot loaded into a CUDA cache: the next call's view equals the CPU
  cache's bit for bit; the CUDA cache's snapshot loads into a CPU cache, which writes
  the CPU's bytes back.

Without a GPU (every machine): ``load`` / ``from_snapshot_bytes`` with a CUDA device
refuse cleanly (NotImplementedError without the CUDA path, RuntimeError without a
device), naming the device, before reading anything.
"""

from __future__ import annotations

import pytest
import torch

import qvg.torch as qt
from conftest import bits_equal, index_tensor

needs_gpu = pytest.mark.skipif(not (qt.HAS_CUDA and torch.cuda.is_available()),
                               reason="needs qvg._C's CUDA path (docs/python.md) and a CUDA device")


def profile(ratio: float) -> qt.QVGKVQuantArgs:
    return qt.QVGKVQuantArgs(bits=2, centroids=16, block_size=32, span_mode="incremental", span_chunks=4,
                             span_break_ratio=ratio, refine_recent=2, refine_bits=2, keep_recent_chunks=1, sink=True,
                             sink_keep_chunks=1, init="warm", scale_search="mse", k_config="bits=4")


def packed(device, quant, B=1, cap=16 * 9, H=2, D=64, sink=16):
    return qt.QVGPackedCausalKVCache(
        batch_size=B, cache_size=cap, num_heads=H, head_dim=D, dtype=torch.bfloat16, device=device,
        global_end_index=index_tensor(), local_end_index=index_tensor(), sink_tokens=sink, quant_args=quant)


def chunk(gen, step, B=1, n=16, H=2, D=64):
    drift = 3.0 if 14 <= step < 18 else 0.05 * step
    base = torch.sin(torch.arange(6 * D, dtype=torch.float32).view(6, D) * 0.37 + drift)
    x = base[torch.arange(n) % 6].view(1, n, 1, D) + 0.4 * torch.randn(2, B, n, H, D, generator=gen)
    return x.bfloat16()


def view_row(g, ge, sink, window):
    se = min(sink, ge)
    tail = max(se, ge - max(0, window - se))
    if tail <= se or g < se:
        return g
    return se + (g - tail) if g >= tail else -1


@pytest.mark.parametrize("ratio", [0.0, 1.2])
@pytest.mark.gpu
@needs_gpu
def test_profile_on_cuda_equals_cpu_decode_of_its_state(ratio):
    cap, sink = 16 * 9, 16
    cpu, dev = packed("cpu", profile(ratio)), packed("cuda", profile(ratio))
    gen = torch.Generator().manual_seed(25)
    checked = 0
    for step in range(24):
        c = dev._segments()[-1]["g0"] if step % 4 == 3 else dev._c.global_end
        x = chunk(gen, step)
        cv = cpu.update_and_get_attention_kv(key=x[0], value=x[1], current_chunk_start=c)
        gv = dev.update_and_get_attention_kv(key=x[0].cuda(), value=x[1].cuda(), current_chunk_start=c)
        segs_c, segs_d = cpu._segments(), dev._segments()
        geometry = [(s["g0"], s["g1"], s["is_sink"], s["packed"], s["chunks"]) for s in segs_d]
        assert geometry == [(s["g0"], s["g1"], s["is_sink"], s["packed"], s["chunks"]) for s in segs_c], step
        if ratio == 0:
            assert dev.resident_nbytes() == cpu.resident_nbytes(), step
        vk, vv = gv.k.cpu(), gv.v.cpu()
        assert vk.shape == cv.k.shape
        ge = gv.visible_global_end
        for i, seg in enumerate(segs_d):
            if not seg["packed"]:
                continue
            hk, hv = dev._c.segment_on_host(i)  # CPU decode of the device's chunk, codebook and layers
            for t, g in enumerate(range(seg["g0"], seg["g1"])):
                row = view_row(g, ge, sink, cap)
                if row >= 0:
                    assert bits_equal(vk[:, row], hk[:, t]) and bits_equal(vv[:, row], hv[:, t]), (step, i, g)
                    checked += 1
    assert checked > 300


@pytest.mark.gpu
@needs_gpu
def test_snapshots_between_cpu_and_cuda_caches(tmp_path):
    q = profile(1.2)
    cpu = packed("cpu", q)
    gen = torch.Generator().manual_seed(26)
    for step in range(12):
        x = chunk(gen, step)
        cpu.update_and_get_attention_kv(key=x[0], value=x[1], current_chunk_start=cpu._c.global_end)
    a = cpu.snapshot_bytes()
    kwargs = dict(batch_size=1, cache_size=16 * 9, num_heads=2, head_dim=64, dtype=torch.bfloat16,
                  global_end_index=index_tensor(), local_end_index=index_tensor(), sink_tokens=16, quant_args=q)
    dev = qt.QVGPackedCausalKVCache.from_snapshot_bytes(a, device="cuda", **kwargs)
    assert dev._c.global_end == cpu._c.global_end and dev.resident_nbytes() == cpu.resident_nbytes()
    b = dev.snapshot_bytes()
    back = qt.QVGPackedCausalKVCache.from_snapshot_bytes(b, device="cpu", **kwargs)
    assert back.snapshot_bytes() == a
    dev.save(tmp_path / "dev.qvgs")
    again = qt.QVGPackedCausalKVCache.load(tmp_path / "dev.qvgs", device="cuda", **kwargs)
    assert again.snapshot_bytes() == b
    c = cpu._segments()[-1]["g0"]
    x = chunk(gen, 99)
    cv = cpu.update_and_get_attention_kv(key=x[0], value=x[1], current_chunk_start=c)
    gv = dev.update_and_get_attention_kv(key=x[0].cuda(), value=x[1].cuda(), current_chunk_start=c)
    assert bits_equal(gv.k.cpu(), cv.k) and bits_equal(gv.v.cpu(), cv.v)


@pytest.mark.skipif(qt.HAS_CUDA and torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_cuda_snapshot_load_refuses_cleanly_without_a_gpu(tmp_path):
    q = qt.QVGKVQuantArgs(bits=2, centroids=16, block_size=32)
    cpu = packed("cpu", q)
    gen = torch.Generator().manual_seed(27)
    for step in range(3):
        x = chunk(gen, step)
        cpu.update_and_get_attention_kv(key=x[0], value=x[1], current_chunk_start=cpu._c.global_end)
    path = tmp_path / "cpu.qvgs"
    cpu.save(path)
    kwargs = dict(batch_size=1, cache_size=16 * 9, num_heads=2, head_dim=64, dtype=torch.bfloat16,
                  global_end_index=index_tensor(), local_end_index=index_tensor(), sink_tokens=16, quant_args=q)
    for load in (lambda: qt.QVGPackedCausalKVCache.load(path, device="cuda", **kwargs),
                 lambda: qt.QVGPackedCausalKVCache.from_snapshot_bytes(cpu.snapshot_bytes(), device="cuda", **kwargs)):
        with pytest.raises((NotImplementedError, RuntimeError), match="cuda"):
            load()
    # The file is untouched and still loads on the CPU.
    assert qt.QVGPackedCausalKVCache.load(path, device="cpu", **kwargs).snapshot_bytes() == cpu.snapshot_bytes()
