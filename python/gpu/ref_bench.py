"""The reference codec's speed on the GPU, for scripts/gpu-check (docs/cuda.md).

Times, with CUDA events (median of --repeats, each event pair around --batch
back-to-back calls), the reference quant-videogen 0.1.0 (imported from the shipped
wheels as gpu-check does: refload.py) on bf16 K/V in [B, S, H, D] (the reference
takes [B, H, S, D], permuted before timing), with the acceptance configuration
(256 centroids, block 64, one stage, 2 k-means iterations, symmetric, fp8 scales):
  - quant_videogen.functions.triton_prq_quantize_tensor / triton_prq_dequantize_tensor;
  - qvg's CUDA encoder and decoder through qvg.torch, when the extension exposes
    them with the codec's keyword arguments — else "ours" is null and summary.py
    takes qvg's figures from the C++ benchmark of the same run;
  - a device-to-device copy (torch) and torch's bf16 matmul rate.

Verdict (default): the LongCat tensor [1, 29640, 32, 128] at int2 only. --extras:
the Self-Forcing chunk [1, 4680, 12, 128] and int4 too (gpu-check's optional second
part). --warm: only the warm-up of the verdict's shape (Triton compiles and
autotunes about 93 configurations for each new token count; the compiled kernels
land in Triton's cache, ~/.triton/cache), timing nothing, writing nothing: gpu-check
runs it during the build. In a timed run the autotuning of each shape happens in an
untimed warm-up call too.

The JSON file is rewritten after every row ("complete": false until the last), so a
run cut short leaves every row it finished. Exits 2 without a CUDA device, 3 when
the reference cannot be imported.

Usage: python3 python/gpu/ref_bench.py --out FILE [--repeats N] [--batch N] [--extras]
       python3 python/gpu/ref_bench.py --warm
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERDICT = [("longcat tensor", (1, 29640, 32, 128), 2)]
EXTRAS = [("longcat tensor", (1, 29640, 32, 128), 4), ("self-forcing chunk", (1, 4680, 12, 128), 2),
          ("self-forcing chunk", (1, 4680, 12, 128), 4)]


def timed(fn, repeats: int, batch: int = 1, warmup: int = 2) -> float:
    """Median milliseconds of one fn() call: CUDA events around `batch` back-to-back
    calls (launch gaps amortised over the batch), `repeats` times."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(batch):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / batch)
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


def write(path: str, out: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batch", type=int, default=1, help="calls per event pair (decode rows use max(this, 20))")
    ap.add_argument("--extras", action="store_true", help="the Self-Forcing chunk and int4 too")
    ap.add_argument("--warm", action="store_true", help="warm up (compile, autotune) the verdict shape only")
    args = ap.parse_args()
    if not args.warm and not args.out:
        ap.error("--out is required unless --warm")
    import torch

    if not torch.cuda.is_available():
        print("ref_bench: no CUDA device", file=sys.stderr)
        return 2
    sys.path.insert(0, str(HERE))
    import refload  # type: ignore[import-not-found]

    try:
        quantize, dequantize, how = refload.load_reference()
    except Exception as e:  # noqa: BLE001
        print(f"ref_bench: the reference cannot be imported ({type(e).__name__}: {e})", file=sys.stderr)
        return 3
    rows = VERDICT + (EXTRAS if args.extras else [])

    def quant(xr, bits):
        return quantize(xr, num_stages=1, num_clusters=256, block_size=64, max_iters=2,
                        scale_precision=torch.float8_e4m3fn, quantize_fn=lambda _t, _b=bits: _b, asymmetric=False)

    if args.warm:
        t0 = time.time()
        for name, shape, bits in VERDICT:
            x = clustered(shape, 1)
            xr = x.permute(0, 2, 1, 3).contiguous()
            packed = quant(xr, bits)
            dequantize(packed, 64, bits, output_dtype=torch.bfloat16)
            torch.cuda.synchronize()
            print(f"ref_bench: warmed {name} int{bits} in {time.time() - t0:.1f} s ({how})", flush=True)
        return 0

    try:
        import qvg.torch as qt

        ours_api = getattr(qt, "encode", None) if getattr(qt, "_ENCODE_TAKES_CODEC_KWARGS", False) else None
    except ImportError:
        ours_api = None
    out: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "reference": how,
                 "repeats": args.repeats, "results": [], "complete": False}

    n = 1 << 28  # 512 MiB of bf16
    src = torch.ones(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), args.repeats)
    out["copy_gbs"] = 2 * src.numel() * 2 / (ms * 1e6)
    del src, dst
    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    ms = timed(lambda: a @ b, args.repeats)
    out["matmul_bf16_tflops"] = 2 * m**3 / (ms * 1e9)
    del a, b
    write(args.out, out)

    dec_batch = max(args.batch, 20)
    for name, shape, bits in rows:
        x = clustered(shape, 1)
        xr = x.permute(0, 2, 1, 3).contiguous()  # the reference's [B, H, S, D]
        t0 = time.time()
        packed = quant(xr, bits)  # autotuning happens here, untimed
        torch.cuda.synchronize()
        warm_s = time.time() - t0
        enc_ms = timed(lambda: quant(xr, bits), args.repeats, args.batch)  # noqa: B023
        y = dequantize(packed, 64, bits, output_dtype=torch.bfloat16)
        dec_ms = timed(lambda: dequantize(packed, 64, bits, output_dtype=torch.bfloat16),  # noqa: B023
                       args.repeats, dec_batch)
        rel_mse = float(((y.float() - xr.float()) ** 2).mean() / (xr.float() ** 2).mean())
        row = {"shape": name, "dims": list(shape), "bits": bits, "reference_encode_ms": enc_ms,
               "reference_decode_ms": dec_ms, "reference_rel_mse": rel_mse, "reference_warmup_s": warm_s,
               "decode_batch": dec_batch, "ours_encode_ms": None, "ours_decode_ms": None, "ours_rel_mse": None}
        if ours_api is not None:
            cfg = dict(bits=bits, centroids=256, block_size=64, stages=1, kmeans_iters=2, asymmetric=False,
                       scale_dtype="fp8_e4m3", scaling="compat")
            enc = ours_api(x, **cfg)
            row["ours_encode_ms"] = timed(lambda: ours_api(x, **cfg), args.repeats, args.batch)  # noqa: B023
            z = enc.decode()
            row["ours_decode_ms"] = timed(enc.decode, args.repeats, dec_batch)
            row["ours_rel_mse"] = float(((z.float() - x.float()) ** 2).mean() / (x.float() ** 2).mean())
        out["results"].append(row)
        write(args.out, out)
        print(json.dumps(row), flush=True)
        del packed, y, x, xr
        torch.cuda.empty_cache()
    out["complete"] = True
    write(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
