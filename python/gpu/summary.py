"""gpu-check.json: the verdict of a scripts/gpu-check run (docs/cuda.md, "Running the GPU
checks").

Every figure the steps left in the output folder, each acceptance with its limit and
whether it is met, and all_met. An acceptance whose inputs are missing is "not run"
(met: null); all_met is true only when every acceptance ran and was met. Every step
of the verdict is an acceptance of its own (exit status 0): a step that failed, ran
past its limit or never ran makes all_met false even when the figures it left look
good. The conformance checks (compat-check.json, written by compat_check.py: "ok",
"complete" and per bit width "results") give one acceptance per bit width. Issue 41's
figures (encode 2x the reference, decode 0.85 / 0.8 of copy bandwidth, assignment 0.5 of
cuBLAS, kmeans++ 2 ms per stage) are "targets" beside them, with targets_met; they do not
enter all_met.

Standard library only (gpu-check calls it from an exit trap, also after a timeout).

Usage: python3 python/gpu/summary.py OUT_DIR STEPS [--budget-s 240] [--build-budget-s 120]
  STEPS: a JSON file {"step": {"rc": int | null, "seconds": float}, ...}, or a folder
  of such records, one file NAME.json per step (gpu-check writes one per step, also
  from parallel steps).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

# The steps of the verdict run, each required to exit 0 (scripts/gpu-check).
VERDICT_STEPS = {
    "build": "one build of the CUDA library, the GPU tests and benchmarks and the PyTorch extension",
    "ref_warm": "the reference's Triton warm-up (compile and autotune, during the build)",
    "host_tests": "the host-side tests of the CUDA kernels' bodies (ctest ^cuda.host)",
    "gpu_tests": "every GPU test passes (decode bit-identical to the CPU; encode equal to its host replay)",
    "pytest_cuda": "the PyTorch CUDA tests pass (python/tests/test_cuda.py)",
    "compat_check": "the reference-codec conformance checks on the GPU (python/gpu/compat_check.py)",
    "gpu_bench": "the C++ GPU benchmarks (qvg_gpu_bench --verdict)",
    "ref_bench": "the reference codec timed beside qvg (python/gpu/ref_bench.py)",
}


def load(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_steps(path: str) -> dict:
    if os.path.isdir(path):
        steps = {}
        for name in sorted(os.listdir(path)):
            if name.endswith(".json"):
                rec = load(os.path.join(path, name))
                if isinstance(rec, dict):
                    steps[name[:-5]] = rec
        return steps
    d = load(path)
    return d if isinstance(d, dict) else {}


def summarize(out_dir: str, steps: dict, budget_s: float = 240, build_budget_s: float = 120) -> dict:
    cpp = load(os.path.join(out_dir, "gpu-bench.json"))
    ref = load(os.path.join(out_dir, "ref-bench.json"))
    compat = load(os.path.join(out_dir, "compat-check.json"))
    cpp = cpp if isinstance(cpp, dict) else None
    ref = ref if isinstance(ref, dict) else None
    compat = compat if isinstance(compat, dict) else None
    acc: list[dict] = []

    def add(name, value, limit, met, note=""):
        acc.append({"acceptance": name, "value": value, "limit": limit, "met": met, **({"note": note} if note else {})})

    for step, what in VERDICT_STEPS.items():
        s = steps.get(step)
        rc = s.get("rc") if isinstance(s, dict) else None
        note = "" if s is None else (s.get("note") or "")
        if rc == 124 or rc == 137:
            note = (note + "; " if note else "") + "ran past its time limit"
        add(f"step {step} exits 0: {what}", rc, "exit status 0", None if rc is None else rc == 0, note)

    rows = [r for r in (cpp or {}).get("results", []) if isinstance(r, dict) and "name" in r]

    def cpp_rows(prefix):
        return [r for r in rows if r["name"].startswith(prefix)]

    dec = cpp_rows("decode ")
    add("decode bandwidth >= 0.7 x the measured copy bandwidth (every shape and bit width)",
        min((r.get("fraction", 0) for r in dec), default=None), 0.7,
        None if not dec else all(r.get("fraction", 0) >= 0.7 for r in dec))
    asg = cpp_rows("k-means assignment")
    add("k-means assignment >= 0.3 x the cuBLAS bf16 matmul rate", asg[0].get("fraction") if asg else None, 0.3,
        None if not asg else asg[0].get("fraction", 0) >= 0.3)

    # A denoising step's update() (7-chunk window, Self-Forcing chunk; docs/cuda.md,
    # "update() does not wait") against a copy of the view's bytes: <= 1.0x without
    # refinement layers, <= 1.2x with 4.
    for label, limit in (("no refinement layer", 1.0), ("4 refinement layers", 1.2)):
        up = cpp_rows(f"update() step, 7-chunk window, recommended, {label}")
        add(f"update() step ({label}) <= {limit} x a device copy of the view's bytes",
            up[0].get("fraction") if up else None, limit, None if not up else up[0].get("fraction", 1e9) <= limit)

    def ours(shape, bits, what):
        """qvg's time: from the reference benchmark's process when it timed qvg there,
        else from the C++ benchmark of this run."""
        for r in (ref or {}).get("results", []):
            if r.get("shape") == shape and r.get("bits") == bits and r.get(f"ours_{what}_ms") is not None:
                return r[f"ours_{what}_ms"], "same process (python/gpu/ref_bench.py)"
        for r in rows:
            if r["name"].startswith(f"{what} {shape} int{bits}"):
                return r.get("ms"), "qvg_gpu_bench, same run, another process"
        return None, ""

    def theirs(shape, bits, what):
        for r in (ref or {}).get("results", []):
            if r.get("shape") == shape and r.get("bits") == bits:
                return r.get(f"reference_{what}_ms")
        return None

    for what, verb in (("encode", "encoder"), ("decode", "dequantizer")):
        o, src = ours("longcat tensor", 2, what)
        t = theirs("longcat tensor", 2, what)
        ratio = None if not o or not t else o / t
        add(f"{what} of the LongCat tensor at int2: qvg faster than the reference's Triton {verb} (time ratio < 1)",
            ratio, 1.0, None if ratio is None else ratio < 1.0, f"qvg {o} ms ({src}), reference {t} ms")

    # Issue 41's figures (docs/cuda.md): reported beside the acceptances, each with its
    # limit and whether it is met (null: not measured), and targets_met; they do not
    # enter all_met, which keeps the verdict's contract (every step, the figures above).
    targets: list[dict] = []

    def target(name, value, limit, met):
        targets.append({"target": name, "value": value, "limit": limit, "met": met})

    o, _ = ours("longcat tensor", 2, "encode")
    t = theirs("longcat tensor", 2, "encode")
    ratio = None if not o or not t else o / t
    target("issue 41: encode of the LongCat tensor at int2 >= 2x faster than the reference's Triton encoder "
           "(time ratio <= 0.5)", ratio, 0.5, None if ratio is None else ratio <= 0.5)
    for label, prefix, limit in (("the LongCat tensor at int2 and int4", "decode longcat tensor", 0.85),
                                 ("the Self-Forcing 7-chunk window", "decode self-forcing 7-chunk window", 0.8)):
        d = cpp_rows(prefix)
        low = min((r.get("fraction", 0) for r in d), default=None)
        target(f"issue 41: decode of {label} >= {limit} x the copy bandwidth", low, limit,
               None if low is None else low >= limit)
    target("issue 41: k-means assignment >= 0.5 x the cuBLAS bf16 matmul rate", asg[0].get("fraction") if asg else None,
           0.5, None if not asg else asg[0].get("fraction", 0) >= 0.5)
    kpp = cpp_rows("kmeans++ init longcat tensor")
    target("issue 41: init kmeans++ at the LongCat tensor <= 2 ms per stage", kpp[0].get("ms") if kpp else None, 2.0,
           None if not kpp else kpp[0].get("ms", 1e9) <= 2.0)

    # The conformance checks: one acceptance per bit width, from compat_check's results.
    results = (compat or {}).get("results") or {}
    for bits in (2, 4):
        r = results.get(f"int{bits}")
        name = (f"reference-codec checks at int{bits} (docs/compat.md section 4): qvg's relative MSE <= 1.02 x the reference's, "
                "both packed-dict decodes exact (0 ulp)")
        if not isinstance(r, dict):
            note = "not run" if compat is None else f"no int{bits} result in compat-check.json"
            if compat is not None and compat.get("error"):
                note += f" ({compat['error']})"
            add(name, None, 1.02, None, note)
            continue
        limit = r.get("ratio_limit", 1.02)
        ratio = r.get("ratio")
        met = (ratio is not None and ratio <= limit and r.get("max_ulp_ref_dict_decoded_by_qvg") == 0
               and r.get("max_ulp_qvg_dict_decoded_by_ref") == 0 and r.get("passed") is True)
        add(name, ratio, limit, met, f"ulps {r.get('max_ulp_ref_dict_decoded_by_qvg')} / "
            f"{r.get('max_ulp_qvg_dict_decoded_by_ref')}")
    add("compat-check.json complete and ok", None if compat is None else compat.get("ok"), True,
        None if compat is None else (compat.get("ok") is True and compat.get("complete", True) is True))

    total = steps.get("_total", {}).get("seconds") if isinstance(steps.get("_total"), dict) else None
    if total is None:
        total = sum((s.get("seconds") or 0) for k, s in steps.items() if isinstance(s, dict) and k != "ref_warm")
    build = sum((s.get("seconds") or 0) for k, s in steps.items() if isinstance(s, dict) and k.startswith("build"))
    add(f"the build takes at most {build_budget_s:g} s", build, build_budget_s,
        build <= build_budget_s if "build" in steps else None)
    add(f"the whole verdict run takes at most {budget_s:g} s", total, budget_s, total <= budget_s if steps else None)

    return {"steps": {k: v for k, v in steps.items() if k != "_total"}, "total_s": total, "cpp_bench": cpp,
            "reference_bench": ref, "compat_check": compat, "acceptances": acc,
            "all_met": bool(acc) and all(a["met"] is True for a in acc), "targets": targets,
            "targets_met": all(x["met"] is True for x in targets)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="writes OUT_DIR/gpu-check.json")
    ap.add_argument("out_dir")
    ap.add_argument("steps")
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--build-budget-s", type=float, default=120)
    a = ap.parse_args(argv)
    summary = summarize(a.out_dir, load_steps(a.steps), a.budget_s, a.build_budget_s)
    with open(os.path.join(a.out_dir, "gpu-check.json"), "w") as f:
        json.dump(summary, f, indent=1)
    for x in summary["acceptances"]:
        mark = {True: "met", False: "NOT MET", None: "not run"}[x["met"]]
        print(f"gpu-check: [{mark:>7}] {x['acceptance']}: {x['value']} (limit {x['limit']})")
    print(f"gpu-check: all_met = {summary['all_met']}")
    for x in summary["targets"]:
        mark = {True: "met", False: "NOT MET", None: "not run"}[x["met"]]
        print(f"gpu-check: [{mark:>7}] {x['target']}: {x['value']} (limit {x['limit']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
