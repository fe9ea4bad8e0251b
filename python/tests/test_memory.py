"""The int4 packed cache at a realistic block shape: memory under 0.7 of the dense
cache's buffers once the window is full, and a faithful reconstruction.

Shape: bf16, batch 1, 4 heads, head_dim 128, chunks of 1024 tokens, a window of 8
chunks (cache_size = window = 8192), no sink, the default configuration with
bits = 4 (128 centroids, block 64, one stage, two iterations, keep one recent chunk).
"""

from __future__ import annotations

import torch

from conftest import make_dense, make_packed
import qvg.torch as qt

B, H, D, CHUNK, CHUNKS = 1, 4, 128, 1024, 8
CACHE = CHUNK * CHUNKS


def kv_chunk(gen: torch.Generator, offsets: torch.Tensor) -> torch.Tensor:
    """K/V-like data: per-(head, channel) offsets (what k-means captures), a few
    token clusters, and noise."""
    centers = torch.randn(B, 16, H, D, generator=gen) * 2.0
    which = torch.randint(0, 16, (CHUNK,), generator=gen)
    x = centers[:, which] + torch.randn(B, CHUNK, H, D, generator=gen) * 0.5 + offsets
    return x.to(torch.bfloat16)


def test_int4_packed_cache_memory_and_reconstruction():
    gen = torch.Generator().manual_seed(2026)
    offsets = torch.randn(1, 1, H, D, generator=gen) * 4.0
    packed = make_packed(B, CACHE, H, D, torch.bfloat16, quant=qt.QVGKVQuantArgs(bits=4))
    dense = make_dense(B, CACHE, H, D, torch.bfloat16)
    dense_buffer_bytes = 2 * B * CACHE * H * D * 2  # K and V of cache_size tokens
    assert dense.resident_nbytes() == dense_buffer_bytes

    ks, vs = [], []
    for i in range(CHUNKS + 2):  # fill the window, then slide it by two chunks
        k, v = kv_chunk(gen, offsets), kv_chunk(gen, -offsets) * 3.0
        ks.append(k)
        vs.append(v)
        pv = packed.update_and_get_attention_kv(key=k, value=v, current_chunk_start=i * CHUNK)
        dv = dense.update_and_get_attention_kv(key=k, value=v, current_chunk_start=i * CHUNK)
        if i + 1 >= CHUNKS:
            ratio = packed.resident_nbytes() / dense_buffer_bytes
            assert ratio < 0.7, ratio
    segs = packed._segments()
    assert [s["packed"] for s in segs] == [True] * (CHUNKS - 2) + [False, False]
    assert packed.resident_nbytes() == sum(s["nbytes"] for s in segs)

    # The view: the last 8 chunks, packed ones decoded; raw ones exact.
    assert pv.k.shape == dv.k.shape == (B, CACHE, H, D)
    ref_k = torch.cat(ks[-CHUNKS:], dim=1).float()
    ref_v = torch.cat(vs[-CHUNKS:], dim=1).float()
    assert torch.equal(dv.k.float(), ref_k)
    raw = slice(CACHE - 2 * CHUNK, CACHE)
    assert torch.equal(pv.k[:, raw], dv.k[:, raw]) and torch.equal(pv.v[:, raw], dv.v[:, raw])
    for got, ref in ((pv.k.float(), ref_k), (pv.v.float(), ref_v)):
        err = got - ref
        rel_mse = (err.pow(2).mean() / ref.var()).item()
        assert rel_mse < 2e-3, rel_mse
    # Every decoded element within half a quantization step of its input, plus the
    # rounding to bf16 (a bound per element, not 0.2 * max|ref| over the whole view, ten
    # times the step). The packed chunks' encodings are qt.encode's of their input
    # (checked bit for bit), whose scales give each element's step.
    q = qt.QVGKVQuantArgs(bits=4)
    for i in range(CHUNKS - 2):  # the packed chunks of the view
        rows = slice(i * CHUNK, (i + 1) * CHUNK)
        for x, got in ((ks[-CHUNKS + i], pv.k[:, rows]), (vs[-CHUNKS + i], pv.v[:, rows])):
            enc = qt.encode(x, q)
            assert torch.equal(qt.decode(enc), got)
            step = effective_scales(enc)
            err = (x.float() - got.float()).abs()
            bound = 0.5 * step * (1 + 2**-20) + got.float().abs() * 2**-8
            assert bool((err <= bound).all()), (i, (err / bound).max().item())
            assert err.max().item() > 0.25 * step.max().item()  # the bound is not vacuous: errors reach it


def effective_scales(enc: qt.Encoding) -> torch.Tensor:
    """Each element's quantization step s_eff (spec 1.4: the stored scale times the
    group's scale factor with two_level scaling), as a [B, S, H, D] float32 tensor."""
    lay = enc.layout
    b, s, h, d = lay["shape"]
    blocks = d // lay["block_size"]
    stored = {"fp8_e4m3": torch.float8_e4m3fn, "bf16": torch.bfloat16}[lay["scale_dtype"]]
    scales = enc.arrays["scales"].view(stored).float().reshape(b, h, s, blocks)
    if lay["scaling"] == "two_level":
        scales = scales * enc.arrays["scale_factor"].view(torch.float32).reshape(b, h, 1, 1)
    return scales.repeat_interleave(lay["block_size"], dim=-1).permute(0, 2, 1, 3)


def test_refinement_layers_of_the_newest_chunks():
    """Incremental spans with refine_recent (docs/spans.md): the two newest encoded
    chunks hold refinement layers (counted in resident_nbytes), their rows are closer
    to the input than without, and every other row is the same as without."""
    gen = torch.Generator().manual_seed(17)
    offsets = torch.randn(1, 1, H, D, generator=gen) * 4.0
    base = dict(bits=2, centroids=64, span_chunks=4, span_mode="incremental")
    plain = make_packed(B, CACHE, H, D, torch.bfloat16, quant=qt.QVGKVQuantArgs(**base))
    refined = make_packed(B, CACHE, H, D, torch.bfloat16,
                          quant=qt.QVGKVQuantArgs(**base, refine_recent=2, refine_bits=2))
    ks = []
    for i in range(6):
        k, v = kv_chunk(gen, offsets), kv_chunk(gen, -offsets)
        ks.append(k)
        pa = plain.update_and_get_attention_kv(key=k, value=v, current_chunk_start=i * CHUNK)
        pb = refined.update_and_get_attention_kv(key=k, value=v, current_chunk_start=i * CHUNK)
    sa, sb = plain._segments(), refined._segments()
    assert [s["packed"] for s in sb] == [True] * 4 + [False, False]
    extra = [b["nbytes"] - a["nbytes"] for a, b in zip(sa, sb)]
    assert extra[:2] == [0, 0] and extra[2] > 0 and extra[3] == extra[2] and extra[4:] == [0, 0]
    assert refined.resident_nbytes() - plain.resident_nbytes() == 2 * extra[2]
    ref = torch.cat(ks, dim=1).float()
    old, new = slice(0, 2 * CHUNK), slice(2 * CHUNK, 4 * CHUNK)
    assert torch.equal(pa.k[:, old], pb.k[:, old])
    err_a = (pa.k[:, new].float() - ref[:, new]).pow(2).mean().item()
    err_b = (pb.k[:, new].float() - ref[:, new]).pow(2).mean().item()
    assert err_b < 0.5 * err_a, (err_a, err_b)
