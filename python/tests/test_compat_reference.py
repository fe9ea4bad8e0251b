"""Interop with the reference codec quant-videogen 0.1.0 (docs/compat.md, section 4).

On the CPU the reference's dequantizer runs under Triton's interpreter
(compat_common.reference_dequantize says how), and so does its quantizer for float32
input once the interpreter is mended around it (reference_cpu.py: CUDA asserts dropped,
libdevice.round, RNE/saturating float conversions). The relative-MSE comparison at the
engine's default configuration is python/gpu/compat_check.py (--device cpu here; on the
GPU with bf16 input from scripts/gpu-check).
"""

from __future__ import annotations

import pytest
import torch

import qvg.torch as qt
from compat_common import reference_dequantize

CONFIGS = [(bits, asym, sd, stages) for bits in (2, 4) for asym in (False, True) for sd in ("fp8_e4m3", "bf16")
           for stages in (1, 2)]


def _i16(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def compat_encoding(seed: int, bits: int, asym: bool, sd: str, stages: int, dtype=torch.bfloat16,
                    shape=(2, 40, 2, 128), scale: float = 3.0) -> qt.Encoding:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=g) * scale).to(dtype)
    q = qt.QVGKVQuantArgs(bits=bits, scaling="compat", centroids=16, asymmetric=asym, scale_dtype=sd, stages=stages,
                          block_size=64)
    return qt.encode(x, q)


@pytest.mark.parametrize("bits,asym,sd,stages", CONFIGS)
def test_qvg_encoding_decoded_by_the_reference(bits, asym, sd, stages):
    """qvg's compat encoding -> to_reference -> the reference's dequantizer equals
    qvg's decode: bit for bit when the reference returns fp32 and that is rounded to
    bf16 (to nearest even); straight to bf16 under the CPU interpreter within 1 ulp,
    because the interpreter's fp32 -> bf16 store truncates (pinned: its bf16 output is
    exactly the truncation of its fp32 output). On a GPU the store rounds to nearest
    even (python/gpu/compat_check.py checks the direct bf16 output there)."""
    fn, how = reference_dequantize()
    enc = compat_encoding(bits * 100 + stages, bits, asym, sd, stages)
    ref = qt.to_reference(enc)
    ours = qt.decode(enc).permute(0, 2, 1, 3).contiguous()
    r32 = fn(ref, 64, bits, output_dtype=torch.float32)
    assert torch.equal(_i16(r32.to(torch.bfloat16)), _i16(ours))
    rbf = fn(ref, 64, bits, output_dtype=torch.bfloat16)
    ulp = (_i16(rbf).int() - _i16(ours).int()).abs().max().item()
    if "interpreter" in how:
        truncated = (r32.contiguous().view(torch.int32) >> 16).to(torch.int16)
        assert torch.equal(_i16(rbf), truncated)
        assert ulp <= 1
    else:
        assert ulp == 0


def test_to_reference_keys_dtypes_shapes():
    enc = compat_encoding(1, 4, True, "fp8_e4m3", 2)
    ref = qt.to_reference(enc)
    B, S, H, D = enc.layout["shape"]
    assert set(ref) == {"centroids_list", "cluster_ids_list", "residual_quant", "scales", "zeros"}
    assert [tuple(c.shape) for c in ref["centroids_list"]] == [(B, H, 16, D)] * 2
    assert all(c.dtype == torch.bfloat16 for c in ref["centroids_list"])
    assert [(tuple(i.shape), i.dtype) for i in ref["cluster_ids_list"]] == [((B, H, S), torch.uint8)] * 2
    assert (tuple(ref["residual_quant"].shape), ref["residual_quant"].dtype) == ((B, H, S, D // 2), torch.uint8)
    assert (tuple(ref["scales"].shape), ref["scales"].dtype) == ((B, H, S, D // 64), torch.float8_e4m3fn)
    assert ref["zeros"].dtype == torch.float8_e4m3fn
    assert qt.to_reference(compat_encoding(1, 4, False, "bf16", 1))["zeros"] is None


def test_a_width_the_reference_lacks_is_refused_by_to_reference():
    """int3 is qvg's extension (qvg/code_format.h): the reference has no layout for it."""
    assert qt._C.engine_code_widths() == [2, 4]
    enc = compat_encoding(1, 3, False, "fp8_e4m3", 1)
    with pytest.raises(ValueError, match=r"a width the reference has \(2, 4 bits; int3 is qvg's extension\), got bits 3"):
        qt.to_reference(enc)


def test_two_level_encoding_refused_by_to_reference():
    x = torch.randn(1, 16, 1, 64).to(torch.bfloat16)
    enc = qt.encode(x, qt.QVGKVQuantArgs(bits=4, centroids=8))
    with pytest.raises(ValueError, match="compat"):
        qt.to_reference(enc)


def reference_style_dict(seed: int, bits: int, asym: bool, sd: str, stages: int, B=2, H=2, S=48, D=128, K=16,
                         dtype=torch.bfloat16) -> dict:
    """A packed dict as the reference's quantizer lays it out (which cannot run on the
    CPU): random centroids, ids, codes and plausible scales, with the reference's
    strides (residual_quant and scales are permuted views [B, S, H, .] -> [B, H, S, .])."""
    g = torch.Generator().manual_seed(seed)
    sdt = torch.float8_e4m3fn if sd == "fp8_e4m3" else torch.bfloat16
    cents = [(torch.randn(B, H, K, D, generator=g) * 2).to(dtype) for _ in range(stages)]
    ids = [torch.randint(0, K, (B, H, S), generator=g).to(torch.uint8) for _ in range(stages)]
    codes = torch.randint(0, 256, (B, S, H, D * bits // 8), generator=g).to(torch.uint8).permute(0, 2, 1, 3)
    if not asym and bits == 2:  # symmetric codes never exceed 2 * qmax: no code 3 in int2
        codes = codes & 0b10101010 | (codes & 0b01010101 & ~((codes & 0b10101010) >> 1))
    if not asym and bits == 4:
        hi, lo = (codes >> 4) % 15, (codes & 15) % 15
        codes = (hi << 4 | lo).to(torch.uint8)
    scales = (torch.rand(B, S, H, D // 64, generator=g) * 0.5).to(sdt).permute(0, 2, 1, 3)
    zeros = ((torch.rand(B, S, H, D // 64, generator=g) - 0.5)).to(sdt).permute(0, 2, 1, 3) if asym else None
    return {"centroids_list": cents, "cluster_ids_list": ids, "residual_quant": codes, "scales": scales,
            "zeros": zeros}


@pytest.mark.parametrize("bits,asym,sd,stages", CONFIGS)
def test_reference_dict_decoded_by_qvg(bits, asym, sd, stages):
    """A reference-style dict decoded by qvg equals the reference's dequantization
    (fp32 output rounded to bf16 to nearest even, see above)."""
    fn, _ = reference_dequantize()
    packed = reference_style_dict(bits * 10 + stages, bits, asym, sd, stages)
    enc = qt.from_reference(packed, 64, bits)
    ours = qt.decode(enc).permute(0, 2, 1, 3).contiguous()
    r32 = fn(packed, 64, bits, output_dtype=torch.float32)
    assert torch.equal(_i16(r32.to(torch.bfloat16)), _i16(ours))
    # and back: to_reference(from_reference(d)) holds the same tensors
    back = qt.to_reference(enc)
    for key in ("residual_quant", "scales"):
        assert torch.equal(back[key].contiguous().view(torch.uint8), packed[key].contiguous().view(torch.uint8))
    assert all(torch.equal(a, b) for a, b in zip(back["cluster_ids_list"], packed["cluster_ids_list"]))


def _bad_cases():
    def drop(key):
        def f(d):
            del d[key]
        return f

    def setv(key, value):
        def f(d):
            d[key] = value(d) if callable(value) else value
        return f

    return {
        "missing centroids_list": (drop("centroids_list"), "centroids_list"),
        "missing cluster_ids_list": (drop("cluster_ids_list"), "cluster_ids_list"),
        "missing residual_quant": (drop("residual_quant"), "residual_quant"),
        "missing scales": (drop("scales"), "scales"),
        "ids int64": (setv("cluster_ids_list", lambda d: [i.long() for i in d["cluster_ids_list"]]),
                      r"cluster_ids_list\[0\]"),
        "codes int8": (setv("residual_quant", lambda d: d["residual_quant"].to(torch.int8)), "residual_quant"),
        "scales f32": (setv("scales", lambda d: d["scales"].float()), "scales"),
        "centroids f64": (setv("centroids_list", lambda d: [c.double() for c in d["centroids_list"]]),
                          r"centroids_list\[0\]"),
        "zeros other dtype": (setv("zeros", lambda d: d["scales"].to(torch.bfloat16)), "zeros"),
        "codes wrong width": (setv("residual_quant", lambda d: d["residual_quant"][..., :-1]), "residual_quant"),
        "scales wrong S": (setv("scales", lambda d: d["scales"][:, :, :-1]), "scales"),
        "ids wrong B": (setv("cluster_ids_list", lambda d: [i[:1] for i in d["cluster_ids_list"]]),
                        r"cluster_ids_list\[0\]"),
        "stages differ": (setv("cluster_ids_list", lambda d: d["cluster_ids_list"][:1]), "cluster_ids_list"),
        "centroids not a list": (setv("centroids_list", lambda d: d["centroids_list"][0]), "centroids_list"),
        "percentile residual": (setv("residual", lambda d: torch.zeros(1)), "residual"),
        "id out of range": (setv("cluster_ids_list", lambda d: [torch.full_like(i, 200) for i in d["cluster_ids_list"]]),
                            "ids"),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_bad_reference_dicts(case):
    """ValueError naming the key; the input dict is untouched (nothing half-converted)."""
    mutate, key = _bad_cases()[case]
    packed = reference_style_dict(7, 4, True, "fp8_e4m3", 2)
    mutate(packed)
    before = {k: (list(v) if isinstance(v, list) else v) for k, v in packed.items()}
    snapshot = {k: [t.clone() for t in v] if isinstance(v, list) else (v.clone() if isinstance(v, torch.Tensor) else v)
                for k, v in packed.items()}
    with pytest.raises(ValueError, match=key):
        qt.decode(qt.from_reference(packed, 64, 4))
    assert packed.keys() == before.keys()
    for k, v in packed.items():
        old = snapshot[k]
        if isinstance(v, list):
            assert all(torch.equal(a, b) for a, b in zip(v, old))
        elif isinstance(v, torch.Tensor):
            assert torch.equal(v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else v,
                               old.view(torch.uint8) if old.dtype == torch.float8_e4m3fn else old)


# ---------------------------------------------------------------------------
# The reference's own quantizer on the CPU (reference_cpu: its Triton kernels under the
# interpreter, float32 input). Its relative MSE against qvg's at the engine's default
# configuration is python/gpu/compat_check.py --device cpu (docs/compat.md, section 4).

def _reference_cpu():
    import reference_cpu

    if reference_cpu.package_root() is None:
        pytest.skip("quant-videogen is not installed; scripts/python.sh installs python/requirements-compat.txt")
    return reference_cpu.load()


def _f32_bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().float().view(torch.int32)


def test_reference_cpu_conversions_are_the_gpus():
    """The interpreter's own fp32 -> fp8 e4m3 conversion loses the carry into the exponent
    (1.9453 -> 1.0) and does not saturate; mended, the reference's packing kernel stores
    the GPU's scales: round to nearest even, saturating at 448 (cvt.rn.satfinite)."""
    quantize, _, _ = _reference_cpu()
    # two points p and -p, one cluster: the centroid is their mean 0 and the residual is
    # +-p; int2 block scale = block absmax / 1
    v = torch.rand(128, generator=torch.Generator().manual_seed(3))
    v[:64] *= 1.5
    v[5] = 1.9453125  # first block's absmax: fp8 2.0 (the interpreter's own: 1.0)
    v[64:] *= 900
    v[100] = 1000.0   # second block: saturates to 448
    x = torch.stack([v, -v]).reshape(1, 1, 2, 128)
    d = quantize(x, num_stages=1, num_clusters=1, block_size=64, max_iters=1, quantize_fn=lambda _t: 2)
    assert float(d["centroids_list"][0].abs().max()) == 0.0
    assert d["scales"].float().flatten().tolist() == [2.0, 448.0, 2.0, 448.0]


@pytest.mark.parametrize("bits,asym,sd", [(2, False, "fp8_e4m3"), (4, False, "fp8_e4m3"), (2, True, "fp8_e4m3"),
                                          (4, True, "bf16")])
def test_reference_quantizer_dict_decoded_by_qvg(bits, asym, sd):
    """The reference's own quantizer (CPU, float32 input) gives a packed dict that qvg's
    from_reference + decode turns into exactly the reference's dequantization (float32
    output, bit for bit), and qvg's to_reference gives back the same tensors."""
    quantize, dequantize, _ = _reference_cpu()
    g = torch.Generator().manual_seed(bits * 10 + asym)
    x = (torch.randn(1, 2, 96, 128, generator=g) * 3).to(torch.bfloat16).float()  # [B, H, S, D]
    sdt = torch.float8_e4m3fn if sd == "fp8_e4m3" else torch.bfloat16
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        packed = quantize(x, num_stages=1, num_clusters=16, block_size=64, max_iters=2, scale_precision=sdt,
                          quantize_fn=lambda _t: bits, asymmetric=asym)
    ref = dequantize(packed, 64, bits, output_dtype=torch.float32)
    enc = qt.from_reference(packed, 64, bits)
    ours = qt.decode(enc).permute(0, 2, 1, 3)
    assert torch.equal(_f32_bits(ours), _f32_bits(ref))
    # a real encoding, not a degenerate one: well below the error of the residual alone
    rel = float(((ref - x) ** 2).sum() / (x**2).sum())
    assert rel < (0.6 if bits == 2 else 0.03)
    back = qt.to_reference(enc)
    assert torch.equal(back["residual_quant"].contiguous(), packed["residual_quant"].contiguous())
    assert torch.equal(back["scales"].contiguous().view(torch.uint8), packed["scales"].contiguous().view(torch.uint8))


@pytest.mark.parametrize("bits", [2, 4])
def test_qvg_float32_encoding_decoded_by_the_reference_quantizers_dequantizer(bits):
    """qvg's compat encoding of a float32 tensor (float32 centroids) decoded by the
    reference's dequantizer equals qvg's decode bit for bit (float32 output)."""
    _, dequantize, _ = _reference_cpu()
    enc = compat_encoding(40 + bits, bits, False, "fp8_e4m3", 1, dtype=torch.float32)
    r32 = dequantize(qt.to_reference(enc), 64, bits, output_dtype=torch.float32)
    assert torch.equal(_f32_bits(r32), _f32_bits(qt.decode(enc).permute(0, 2, 1, 3)))


def _record_divisions(monkeypatch) -> list[int]:
    """Spies on the Triton interpreter's floating-point divisions (what raises its
    'invalid value encountered in divide' RuntimeWarning, interpreter.py's binary_op):
    every division that gives NaN must be 0 / 0, lane by lane; the list receives the
    number of NaN lanes of each such division."""
    import numpy as np
    import triton.runtime.interpreter as interp

    nan_lanes: list[int] = []
    original = interp.InterpreterBuilder.binary_op

    def spy(self, lhs, rhs, op):
        out = original(self, lhs, rhs, op)
        if op is np.divide:
            bad = np.isnan(out.data)
            if bad.any():
                a, b = np.broadcast_arrays(lhs.data, rhs.data)
                assert (a[bad] == 0).all() and (b[bad] == 0).all(), "a NaN that is not 0 / 0"
                nan_lanes.append(int(bad.sum()))
        return out

    monkeypatch.setattr(interp.InterpreterBuilder, "binary_op", spy)
    return nan_lanes


@pytest.mark.parametrize("heads,zero_head,asym", [(1, False, False), (3, False, False), (3, True, False),
                                                  (3, True, True)])
def test_reference_divide_warning_is_padding_and_zero_blocks_never_a_compared_nan(monkeypatch, heads, zero_head,
                                                                                   asym):
    """The interpreter's divide warning (docs/compat.md, of that name): the
    RuntimeWarning 'invalid value encountered in divide' of test_compat_reference.py and
    test_e2e_sglang.py is quant_pack.py's ``y = x / scale_x`` (asymmetric: ``(x - zero)
    / scale_x``) on lanes whose block scale is 0 and whose value is 0: 0 / 0. The scale
    is clamped to 1e-10 and then rounded to fp8 e4m3, whose smallest step is 2^-9, so a
    zero block's scale becomes 0. Such lanes are (a) the padding of the kernel's last
    tile (reference_cpu fixes the autotuner to its largest tile, BLOCK_D = 512; lanes
    past H * D load 0.0 and are masked at the store) and (b) blocks whose residual is
    zero: a token equal to its centroid (a cluster of one token) or zero data. Every NaN
    lane is one of those, and no NaN reaches a stored scale or a dequantized value (a
    zero-scale block decodes to its centroid whatever its codes): what the tests compare
    is finite and equal to qvg's decode."""
    quantize, dequantize, _ = _reference_cpu()
    nan_lanes = _record_divisions(monkeypatch)
    B, S, D, tile = 1, 24, 128, 512
    g = torch.Generator().manual_seed(heads * 10 + zero_head)
    x = (torch.randn(B, heads, S, D, generator=g) * 3).to(torch.bfloat16).float()
    if zero_head:
        x[:, 1] = 0.0  # a head whose K/V are zero: every block of it, in every row
    packed = quantize(x, num_stages=1, num_clusters=8, block_size=64, max_iters=2, quantize_fn=lambda _t: 2,
                      asymmetric=asym)
    hd = heads * D
    padding = B * S * (-hd % tile)  # lanes past H * D of each row's last tile
    zero_scale_lanes = 64 * int((packed["scales"].float() == 0).sum())  # blocks stored with scale 0
    assert (padding > 0) == (hd % tile != 0)
    assert padding <= sum(nan_lanes) <= padding + zero_scale_lanes, (nan_lanes, padding, zero_scale_lanes)
    if zero_head:
        assert zero_scale_lanes >= S * D and sum(nan_lanes) >= padding + S * D
    ref = dequantize(packed, 64, 2, output_dtype=torch.float32)
    assert torch.isfinite(ref).all() and torch.isfinite(packed["scales"].float()).all()
    if zero_head:
        assert torch.equal(ref[:, 1], torch.zeros_like(ref[:, 1])), "a zero block decodes to zeros"
    ours = qt.decode(qt.from_reference(packed, 64, 2)).permute(0, 2, 1, 3)
    assert torch.equal(_f32_bits(ours), _f32_bits(ref))
