#!/usr/bin/env python3
"""GPU part of the reference-codec interop (docs/compat.md section 4).

What needs CUDA: quant-videogen's quantizer (its k-means wrappers assert CUDA
tensors, its packing calls libdevice.round and casts to float8e4nv). On the workload
generator's K and V (qvg._C.workload_kv), at the engine's default configuration
(int2 and int4; 128 centroids, block 64, 1 stage, 2 k-means iterations, symmetric,
fp8 scales; qvg with ``compat`` scaling), for each seed:

* relative MSE ``sum((dec - x)^2) / sum(x^2)`` of qvg's encoder (qvg.torch.encode,
  CPU) and of the reference's (``triton_prq_quantize_tensor`` on the GPU under
  ``torch.manual_seed(seed)``, then ``triton_prq_dequantize_tensor``);
* the reference's packed dict decoded by qvg (from_reference) vs the reference's own
  dequantization (bf16 output on the GPU): the largest difference in bf16 ulps;
* qvg's encoding converted (to_reference) and dequantized by the reference on the GPU
  vs qvg's decode: the largest difference in bf16 ulps.
Pass: for each bits, qvg's mean relative MSE <= 1.02 x the reference's, and both
ulp figures 0. Writes a JSON summary (``--out``, default ``$OUT/compat-check.json``)
and exits 1 on a failed check, 2 when it cannot run (no CUDA, no quant-videogen).

Needs qvg importable (PYTHONPATH with the built extension, e.g. build/gpu/python as
scripts/gpu-check builds it) and the reference: always the wheels shipped in
python/gpu/wheels/ (quant-videogen and its pure-Python dependencies, pinned),
imported as scripts/gpu-check does (python/gpu/refload.py: the package's
``__init__`` skipped). The JSON is rewritten after each bit width
(``"complete": false`` until the last), so a run cut short leaves what it finished.

With ``--device cpu`` the same comparison runs without a GPU: the reference's own
Triton kernels under Triton's interpreter (python/tests/reference_cpu.py says what is
mended there). The interpreter computes bf16 arithmetic on raw bit patterns, so on the
CPU the reference quantizes the float32 copy of each bf16 K/V tensor, and the ratio
compares it with qvg's encoding of that same float32 tensor (qvg's bf16 encodings are
reported beside it); the dict checks compare float32 outputs bit for bit (``max_ulp``
is then in float32 ulps). About 150 s for 5 seeds on a 2-core machine.

Usage: python3 python/gpu/compat_check.py [--device cuda|cpu] [--seeds 5] [--preset NAME]
       [--scale 0.25] [--chunk 2] [--layer 0] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

HERE = Path(__file__).resolve().parent


def load_reference() -> tuple[Callable, Callable, str]:
    """(triton_prq_quantize_tensor, triton_prq_dequantize_tensor, how): the shipped
    wheels of python/gpu/wheels, imported as scripts/gpu-check does (refload.py)."""
    sys.path.insert(0, str(HERE))
    import refload  # type: ignore[import-not-found]

    return refload.load_reference()


def rel_mse(dec: torch.Tensor, x: torch.Tensor) -> float:
    d = dec.double() - x.double()
    return float((d * d).sum() / (x.double() * x.double()).sum())


def max_ulp_bf16(a: torch.Tensor, b: torch.Tensor) -> int:
    ia = a.contiguous().to(torch.bfloat16).view(torch.int16).int()
    ib = b.contiguous().to(torch.bfloat16).view(torch.int16).int()
    return int((ia - ib).abs().max())


def max_ulp_f32(a: torch.Tensor, b: torch.Tensor) -> int:
    ia = a.contiguous().float().view(torch.int32).long()
    ib = b.contiguous().float().view(torch.int32).long()
    return int((ia - ib).abs().max())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="where the reference runs (cpu: Triton's interpreter, float32 input)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--preset", default=None, help="workload preset (default: the first)")
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--chunk", type=int, default=2, help="chunk index (after the sink chunks: a regular one)")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out = Path(a.out) if a.out else Path(os.environ.get("OUT", "gpu-results")) / "compat-check.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"ok": False, "complete": False}

    def finish(rc: int) -> int:
        out.write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps(summary, indent=2))
        return rc

    cpu = a.device == "cpu"
    if not cpu and not torch.cuda.is_available():
        summary["error"] = "no CUDA device"
        return finish(2)
    import qvg.torch as qt
    from qvg import _C

    try:
        if cpu:
            sys.path.insert(0, str(HERE.parent / "tests"))
            import reference_cpu  # type: ignore[import-not-found]

            quantize, dequantize, how = reference_cpu.load()
        else:
            quantize, dequantize, how = load_reference()
    except Exception as e:  # noqa: BLE001
        summary["error"] = f"quant-videogen not importable: {type(e).__name__}: {e}"
        return finish(2)
    import triton

    preset = a.preset or _C.workload_presets()[0]
    dev = "cpu" if cpu else "cuda"
    # The dtype the reference quantizes (and the ratio's qvg encodes): the engine's bf16
    # on the GPU; on the CPU the float32 copy (the interpreter's bf16 arithmetic is wrong).
    rdt = torch.float32 if cpu else torch.bfloat16
    out_dt = torch.float32 if cpu else torch.bfloat16
    max_ulp = max_ulp_f32 if cpu else max_ulp_bf16
    summary.update(reference=how, device=dev, reference_input_dtype=str(rdt).replace("torch.", ""),
                   torch=torch.__version__, triton=triton.__version__, preset=preset, scale=a.scale,
                   chunk=a.chunk, layer=a.layer, seeds=a.seeds,
                   config="centroids 128, block 64, 1 stage, 2 iters, symmetric, fp8 scales; qvg scaling compat")
    results: dict[str, Any] = {}
    ok = True
    t0 = time.time()
    for bits in (2, 4):
        per: dict[str, list] = {"qvg": [], "ref": [], "qvg_bf16": [], "ulp_ref_dict_by_qvg": [],
                                "ulp_qvg_dict_by_ref": []}
        for seed in range(a.seeds):
            k, v = _C.workload_kv(preset, a.layer, a.chunk, seed, a.scale)
            for name, xb16 in (("K", k), ("V", v)):
                print(f"compat_check: int{bits} seed {seed} {name} ({time.time() - t0:.0f} s)", file=sys.stderr,
                      flush=True)
                x = xb16.to(rdt)
                q = qt.QVGKVQuantArgs(bits=bits, centroids=128, block_size=64, stages=1, kmeans_iters=2,
                                      asymmetric=False, scaling="compat", scale_dtype="fp8_e4m3", seed=1234 + seed)
                enc = qt.encode(x, q)
                ours = qt.decode(enc)
                per["qvg"].append(rel_mse(ours, x))
                per["qvg_bf16"].append(rel_mse(qt.decode(qt.encode(xb16, q)), xb16))
                xr = x.permute(0, 2, 1, 3).contiguous().to(dev)
                with torch.random.fork_rng(devices=[] if cpu else [xr.device]):
                    torch.manual_seed(1234 + seed)
                    packed = quantize(xr, num_stages=1, num_clusters=128, block_size=64, max_iters=2,
                                      quantize_fn=lambda _t, b=bits: b, asymmetric=False)
                ref_dec = dequantize(packed, 64, bits, output_dtype=out_dt)
                per["ref"].append(rel_mse(ref_dec.cpu(), x.permute(0, 2, 1, 3)))
                # the reference's dict decoded by qvg
                cpu_packed = {key: ([t.cpu() for t in val] if isinstance(val, list) else
                                    (val.cpu() if isinstance(val, torch.Tensor) else val))
                              for key, val in packed.items()}
                by_qvg = qt.decode(qt.from_reference(cpu_packed, 64, bits)).permute(0, 2, 1, 3)
                per["ulp_ref_dict_by_qvg"].append(max_ulp(by_qvg, ref_dec.cpu()))
                # qvg's encoding decoded by the reference
                ref_of_ours = {key: ([t.to(dev) for t in val] if isinstance(val, list) else
                                     (val.to(dev) if isinstance(val, torch.Tensor) else val))
                               for key, val in qt.to_reference(enc).items()}
                by_ref = dequantize(ref_of_ours, 64, bits, output_dtype=out_dt).cpu()
                per["ulp_qvg_dict_by_ref"].append(max_ulp(by_ref, ours.permute(0, 2, 1, 3)))
        mq = sum(per["qvg"]) / len(per["qvg"])
        mr = sum(per["ref"]) / len(per["ref"])
        ratio = mq / mr if mr > 0 else float("inf")
        passed = ratio <= 1.02 and max(per["ulp_ref_dict_by_qvg"]) == 0 and max(per["ulp_qvg_dict_by_ref"]) == 0
        ok = ok and passed
        results[f"int{bits}"] = {
            "qvg_rel_mse_mean": mq, "ref_rel_mse_mean": mr, "ratio": ratio, "ratio_limit": 1.02,
            "qvg_bf16_rel_mse_mean": sum(per["qvg_bf16"]) / len(per["qvg_bf16"]),
            "max_ulp_ref_dict_decoded_by_qvg": max(per["ulp_ref_dict_by_qvg"]),
            "max_ulp_qvg_dict_decoded_by_ref": max(per["ulp_qvg_dict_by_ref"]),
            "per_tensor": per, "passed": passed,
        }
        summary.update(results=results, ok=False, complete=False, wall_s=round(time.time() - t0, 1))
        out.write_text(json.dumps(summary, indent=2) + "\n")  # what is done so far
    summary.update(results=results, ok=ok, complete=True, wall_s=round(time.time() - t0, 1))
    return finish(0 if ok else 1)


if __name__ == "__main__":
    sys.exit(main())
