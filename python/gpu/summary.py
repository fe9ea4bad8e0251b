"""gpu-check.json: every figure of a scripts/gpu-check run, each acceptance of issue 14
(and the reference-codec checks of issue 13) with its limit and whether it is met, and
all_met. Reads what the steps left in the output folder; a step that did not run makes
its acceptances "not run" (met: null), and all_met is true only when every acceptance
ran and was met.

Usage: python3 python/gpu/summary.py OUT_DIR STEPS_JSON
  STEPS_JSON: {"step": {"rc": int | null, "seconds": float}, ...} written by gpu-check.
"""

from __future__ import annotations

import json
import os
import sys


def load(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main() -> int:
    out_dir, steps_path = sys.argv[1], sys.argv[2]
    steps = load(steps_path) or {}
    cpp = load(os.path.join(out_dir, "gpu-bench.json"))
    ref = load(os.path.join(out_dir, "ref-bench.json"))
    compat = load(os.path.join(out_dir, "compat-check.json"))
    acc = []

    def add(name, value, limit, met, note=""):
        acc.append({"acceptance": name, "value": value, "limit": limit, "met": met, **({"note": note} if note else {})})

    def step_ok(step, name):
        s = steps.get(step)
        rc = None if s is None else s.get("rc")
        add(name, rc, "exit status 0", None if rc is None else rc == 0)

    step_ok("host_test", "host-side test of the shared kernel arithmetic passes")
    step_ok("gpu_tests", "every GPU test passes (decode bit-identical to the CPU among them)")
    step_ok("pytest_cuda", "the PyTorch CUDA tests pass (python/tests/test_cuda.py)")

    rows = (cpp or {}).get("results", [])

    def cpp_rows(prefix):
        return [r for r in rows if r["name"].startswith(prefix)]

    dec = cpp_rows("decode ")
    add("decode bandwidth >= 0.7 x the measured copy bandwidth (every shape and bit width)",
        min((r.get("fraction", 0) for r in dec), default=None), 0.7,
        None if not dec else all(r.get("fraction", 0) >= 0.7 for r in dec))
    asg = cpp_rows("k-means assignment")
    add("k-means assignment >= 0.3 x the cuBLAS bf16 matmul rate", asg[0].get("fraction") if asg else None, 0.3,
        None if not asg else asg[0].get("fraction", 0) >= 0.3)

    def ours(shape, bits, what):
        """qvg's time: from the reference benchmark's process when it timed qvg there,
        else from the C++ benchmark of this run."""
        for r in (ref or {}).get("results", []):
            if r["shape"] == shape and r["bits"] == bits and r.get(f"ours_{what}_ms") is not None:
                return r[f"ours_{what}_ms"], "same process (python/gpu/ref_bench.py)"
        for r in rows:
            if r["name"].startswith(f"{what} {shape} int{bits}"):
                return r["ms"], "qvg_gpu_bench, same run, another process"
        return None, ""

    def theirs(shape, bits, what):
        for r in (ref or {}).get("results", []):
            if r["shape"] == shape and r["bits"] == bits:
                return r[f"reference_{what}_ms"]
        return None

    for what, verb in (("encode", "encoder"), ("decode", "dequantizer")):
        o, src = ours("longcat tensor", 2, what)
        t = theirs("longcat tensor", 2, what)
        ratio = None if o is None or t is None else o / t
        add(f"{what} of the LongCat tensor at int2: qvg faster than the reference's Triton {verb} (time ratio < 1)",
            ratio, 1.0, None if ratio is None else ratio < 1.0, f"qvg {o} ms ({src}), reference {t} ms")

    if compat is not None:
        for a in compat.get("acceptances", []):
            acc.append(a)
    else:
        add("reference-codec checks on the GPU (issue 13)", None, None, None, "not run")

    total = sum((s.get("seconds") or 0) for s in steps.values())
    build = sum((s.get("seconds") or 0) for k, s in steps.items() if k.startswith("build"))
    add("the builds take at most 180 s", build, 180, build <= 180 if steps else None)
    add("the whole check takes at most 300 s", total, 300, total <= 300 if steps else None)

    summary = {"steps": steps, "cpp_bench": cpp, "reference_bench": ref, "compat_check": compat,
               "acceptances": acc, "all_met": all(a["met"] is True for a in acc)}
    with open(os.path.join(out_dir, "gpu-check.json"), "w") as f:
        json.dump(summary, f, indent=1)
    for a in acc:
        mark = {True: "met", False: "NOT MET", None: "not run"}[a["met"]]
        print(f"gpu-check: [{mark:>7}] {a['acceptance']}: {a['value']} (limit {a['limit']})")
    print(f"gpu-check: all_met = {summary['all_met']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
