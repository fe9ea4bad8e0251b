"""The reference codec's speed on the GPU, for scripts/gpu-check (issue 14).

Times, with CUDA events (median of --repeats after warm-up; Triton's autotuning runs
in the warm-up, outside the timed region), on the LongCat tensor [1, 29640, 32, 128]
and the Self-Forcing chunk [1, 4680, 12, 128] (bf16, [B, S, H, D] as qvg takes them;
the reference takes [B, H, S, D], permuted before timing), at int2 and int4 with the
configuration of the issue (256 centroids, block 64, one stage, 2 k-means iterations,
symmetric, fp8 scales):
  - quant_videogen.functions.triton_prq_quantize_tensor / triton_prq_dequantize_tensor;
  - qvg's CUDA encoder and decoder through qvg.torch, when the extension exposes them
    (qvg.torch.encode with a CUDA tensor) — else "ours" is null and gpu_summary.py
    takes qvg's figures from the C++ benchmark of the same run;
  - a device-to-device copy (torch) and torch's bf16 matmul rate.
Writes one JSON file. Exits 2 without a CUDA device, 3 without the reference package.

Usage: python3 python/gpu/ref_bench.py --out FILE [--repeats N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

SHAPES = {"longcat tensor": (1, 29640, 32, 128), "self-forcing chunk": (1, 4680, 12, 128)}


def timed(fn, repeats: int, warmup: int = 2) -> float:
    """Median milliseconds of fn() on the current stream (CUDA events)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def clustered(shape, seed: int):
    """Video-like K/V: per-head cluster centres plus noise (bf16, on the GPU)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    b, s, h, d = shape
    centres = torch.randn(h, 64, d, device="cuda", generator=g) * 2.0
    pick = torch.randint(0, 64, (b, s, h), device="cuda", generator=g)
    x = centres[torch.arange(h, device="cuda").view(1, 1, h), pick] + 0.3 * torch.randn(b, s, h, d, device="cuda",
                                                                                         generator=g)
    return x.to(torch.bfloat16).contiguous()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="the Self-Forcing chunk only, 3 repeats")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("ref_bench: no CUDA device", file=sys.stderr)
        return 2
    try:
        from quant_videogen.functions import triton_prq_dequantize_tensor, triton_prq_quantize_tensor
    except ImportError as e:
        print(f"ref_bench: the reference codec is not installed ({e})", file=sys.stderr)
        return 3
    try:
        import qvg.torch as qt

        ours_api = getattr(qt, "encode", None)
    except ImportError:
        ours_api = None
    reps = 3 if args.quick else args.repeats
    shapes = {"self-forcing chunk": SHAPES["self-forcing chunk"]} if args.quick else SHAPES
    out: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "repeats": reps, "results": []}

    n = 1 << 28  # 512 MiB of bf16
    src = torch.ones(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), reps)
    out["copy_gbs"] = 2 * src.numel() * 2 / (ms * 1e6)
    del src, dst
    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    ms = timed(lambda: a @ b, reps)
    out["matmul_bf16_tflops"] = 2 * m**3 / (ms * 1e9)
    del a, b

    for name, shape in shapes.items():
        x = clustered(shape, 1)
        xr = x.permute(0, 2, 1, 3).contiguous()  # the reference's [B, H, S, D]
        for bits in (2, 4):
            t0 = time.time()
            quant = lambda: triton_prq_quantize_tensor(  # noqa: E731
                xr, num_stages=1, num_clusters=256, block_size=64, max_iters=2,
                scale_precision=torch.float8_e4m3fn, quantize_fn=lambda _t, _b=bits: _b, asymmetric=False)
            packed = quant()  # autotuning happens here, untimed
            torch.cuda.synchronize()
            warm_s = time.time() - t0
            enc_ms = timed(quant, reps)
            dequant = lambda: triton_prq_dequantize_tensor(packed, block_size=64, num_bits=bits,  # noqa: E731
                                                           output_dtype=torch.bfloat16)
            y = dequant()
            dec_ms = timed(dequant, reps)
            rel_mse = float(((y.float() - xr.float()) ** 2).mean() / (xr.float() ** 2).mean())
            row = {"shape": name, "dims": list(shape), "bits": bits, "reference_encode_ms": enc_ms,
                   "reference_decode_ms": dec_ms, "reference_rel_mse": rel_mse, "reference_warmup_s": warm_s,
                   "ours_encode_ms": None, "ours_decode_ms": None, "ours_rel_mse": None}
            if ours_api is not None and getattr(qt, "_ENCODE_TAKES_CODEC_KWARGS", False):
                cfg = dict(bits=bits, centroids=256, block_size=64, stages=1, kmeans_iters=2, asymmetric=False,
                           scale_dtype="fp8_e4m3", scaling="compat")
                enc = ours_api(x, **cfg)
                row["ours_encode_ms"] = timed(lambda: ours_api(x, **cfg), reps)
                z = enc.decode()
                row["ours_decode_ms"] = timed(enc.decode, reps)
                row["ours_rel_mse"] = float(((z.float() - x.float()) ** 2).mean() / (x.float() ** 2).mean())
            out["results"].append(row)
            print(json.dumps(row), flush=True)
            del packed, y
        del x, xr
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
