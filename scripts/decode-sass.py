#!/usr/bin/env python3
"""The CUDA decode kernel's instruction counts, from its SASS (no GPU needed).

Compiles the vectorised decode kernels (src/kernels/cuda/decode_int{2,3,4}.cu) for one
architecture (sm_90a unless --arch) and prints, per mode, what ptxas reports
(registers, spill bytes) and the instructions of the hot loop: one batch of
kDecodeBatch (4) tokens of one thread, symmetric and asymmetric. The hot loop is
measured on a second build in which the paths a common decode never takes are
removed (later stages, unaligned element stores, the exact fallback of a bf16 row
holding a NaN; the NaN tests themselves stay), so that the loop's static size is the
instructions a thread issues per batch. docs/cuda.md ("The decode kernel's
instructions") keeps the table; issue 41 item 1 asks for fewer of them.

Needs nvcc, cuobjdump and nvdisasm (not in CUDA's minimal toolkit here:
--install-cuobjdump pip-installs the pinned wheels into build/venv-sass). Takes 1-3 minutes on two cores.

  scripts/decode-sass.py [--arch sm_90a] [--modes all|main] [--base REV]

--base REV also counts the kernels of git revision REV (a worktree in a temporary
folder), for a before/after table.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# cuobjdump runs nvdisasm from its own folder (or NVDISASM_PATH).
SASS_WHEELS = ["nvidia-cuda-cuobjdump==13.5.37", "nvidia-cuda-nvdisasm==13.5.37"]
WIDTH_UNITS = ["decode_int2.cu", "decode_int3.cu", "decode_int4.cu"]
DTYPES = {"0": "bf16", "1": "f16", "2": "f32"}
# The rare paths removed for the hot-loop build: (pattern, replacement) on bodies.cuh.
# Each must match at least once (a changed body makes the script fail, not lie).
HOT_EDITS = [
    (r"T\.stages > 1", "false"),  # later stages
    (r"st < T\.stages", "st < 1"),  # (older bodies: the stage loop)
    (r"P\.vstore != 0", "true"),  # 128-bit stores
    (r"qvg::cuda_arith::f32_to_bf16\(acc\[2 \* i\]\)", "0u"),  # the NaN row's exact fallback
    (r"qvg::cuda_arith::f32_to_bf16\(acc\[2 \* i \+ 1\]\)", "0u"),
]


def find_tool(name: str) -> str | None:
    for cand in [shutil.which(name), f"/usr/local/cuda/bin/{name}"]:
        if cand and os.access(cand, os.X_OK):
            return cand
    venv = ROOT / "build" / "venv-sass"
    for p in venv.glob(f"lib/python*/site-packages/nvidia/*/bin/{name}"):
        return str(p)
    return None


def install_cuobjdump() -> None:
    venv = ROOT / "build" / "venv-sass"
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *SASS_WHEELS], check=True)


def compile_units(src_root: Path, arch: str, out: Path, nvcc: str, units: list[str]) -> list[tuple[str, str]]:
    """Compiles each width's unit to a cubin; returns (ptxas log, cubin path) per unit."""

    def one(unit: str) -> tuple[str, str]:
        cubin = out / (unit + ".cubin")
        cmd = [nvcc, f"-I{src_root}/src", f"-I{src_root}/include", "-O3", "-DNDEBUG",
               f"--generate-code=arch=compute_{arch[3:]},code={arch}", "--fmad=false", "--expt-relaxed-constexpr",
               "-std=c++17", "-Xptxas", "-v", "-cubin", "-x", "cu", str(src_root / "src/kernels/cuda" / unit), "-o",
               str(cubin)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"nvcc failed on {unit}:\n{r.stderr[-3000:]}")
        return r.stderr, str(cubin)

    with ThreadPoolExecutor(max_workers=max(1, min(3, os.cpu_count() or 1))) as ex:
        return list(ex.map(one, units))


def mode_of(name: str) -> str | None:
    m = re.search(r"decode_vec_kernelILi(\d+)ELb(\d)ELi(\d)ELi(\d)ELi(\d+)E", name)
    if not m:
        return None
    bits, fp8, cdt, odt, rbits = m.groups()
    s = f"int{bits} {'fp8' if fp8 == '1' else 'bf16'}-scales {DTYPES[cdt]}->{DTYPES[odt]}"
    return s + (f" +int{rbits} layer" if rbits != "0" else "")


def ptxas_stats(log: str) -> dict[str, tuple[int, int]]:
    stats, cur, spill = {}, None, 0
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = m.group(1)
        m = re.search(r"(\d+) bytes spill stores", line)
        if m:
            spill = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            stats[cur] = (int(m.group(1)), spill)
    return stats


def loops(cuobjdump: str, cubin: str) -> dict[str, list[int]]:
    """Per kernel: the instruction count of each loop of more than 64 instructions
    (a backward branch's span), innermost-first order of appearance."""
    sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    out = {}
    for f in re.split(r"\n\s*Function : ", sass)[1:]:
        name = f.split("\n", 1)[0].strip()
        ins = []
        for line in f.splitlines():
            m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
            if m:
                ins.append((int(m.group(1), 16), m.group(2)))
        spans = []
        for a, t in ins:
            m = re.search(r"BRA\s+(?:\S+,\s*)?0x([0-9a-f]+)", t)
            if m and int(m.group(1), 16) < a:
                lo = int(m.group(1), 16)
                n = sum(1 for b, x in ins if lo <= b <= a and not x.endswith("NOP"))
                if n > 64:
                    spans.append(n)
        out[name] = spans
    return out


def count(src_root: Path, arch: str, nvcc: str, cuobjdump: str) -> dict[str, dict]:
    # Before the per-width units (4b65565) every vectorised kernel was in decode.cu.
    units = WIDTH_UNITS if (src_root / "src/kernels/cuda" / WIDTH_UNITS[0]).exists() else ["decode.cu"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "real").mkdir()
        logs = compile_units(src_root, arch, tmp / "real", nvcc, units)
        stats = {}
        for log, _ in logs:
            stats.update(ptxas_stats(log))
        hot_root = tmp / "hot"
        shutil.copytree(src_root / "src", hot_root / "src")
        shutil.copytree(src_root / "include", hot_root / "include")
        bodies = hot_root / "src/kernels/cuda/bodies.cuh"
        text = bodies.read_text()
        hits = 0
        for pat, rep in HOT_EDITS:
            text, n = re.subn(pat, rep, text)
            hits += n
        if hits < 4:
            sys.exit("decode-sass: the hot-loop edits no longer match bodies.cuh; update HOT_EDITS")
        bodies.write_text(text)
        (tmp / "hotout").mkdir()
        hot = {}
        for _, cubin in compile_units(hot_root, arch, tmp / "hotout", nvcc, units):
            hot.update(loops(cuobjdump, cubin))
    result = {}
    for name, (regs, spill) in stats.items():
        md = mode_of(name)
        if md is None:
            continue
        # A kernel's real and hot builds differ in their anonymous namespace's name; match by mode.
        spans = next((v for k, v in hot.items() if mode_of(k) == md), [])
        result[md] = {"regs": regs, "spill": spill, "loops": sorted(spans)}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--modes", choices=["all", "main"], default="main",
                    help="main: bf16 and f32 centroids decoded to their own dtype, with and without a layer")
    ap.add_argument("--base", help="a git revision to count too (before/after)")
    ap.add_argument("--install-cuobjdump", action="store_true", help=f"pip-install {' and '.join(SASS_WHEELS)} first")
    a = ap.parse_args()
    if a.install_cuobjdump:
        install_cuobjdump()
    nvcc, cuobjdump = find_tool("nvcc"), find_tool("cuobjdump")
    nvdisasm = find_tool("nvdisasm")
    if nvdisasm and "NVDISASM_PATH" not in os.environ:
        os.environ["NVDISASM_PATH"] = str(Path(nvdisasm).parent)
    if not nvcc or not cuobjdump or not nvdisasm:
        sys.exit("decode-sass: needs nvcc, cuobjdump and nvdisasm (--install-cuobjdump installs the last two)")
    now = count(ROOT, a.arch, nvcc, cuobjdump)
    base = None
    if a.base:
        with tempfile.TemporaryDirectory() as wt:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", wt, a.base], check=True,
                           capture_output=True)
            try:
                base = count(Path(wt), a.arch, nvcc, cuobjdump)
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", wt], check=False)
    print(f"decode_vec_kernel, {a.arch}: registers, spill bytes per thread; hot loop = instructions per batch of 4 "
          "tokens (sym / asym: the unrefined kernels' two loops; one loop: the refined kernels, asym read at run time)")
    for md in sorted(now):
        if a.modes == "main" and not re.search(r"(bf16->bf16|f32->f32)", md):
            continue
        r = now[md]
        line = f"{md:44s} {r['regs']:4d} regs {r['spill']:4d} B spill  hot {' / '.join(map(str, r['loops'])):12s}"
        if base and md in base:
            b = base[md]
            line += f"   | before: {b['regs']:4d} regs {b['spill']:4d} B spill  hot {' / '.join(map(str, b['loops']))}"
        print(line)


if __name__ == "__main__":
    main()
