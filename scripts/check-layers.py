#!/usr/bin/env python3
"""Checks that qvg's layers point down only (docs/design.md, "Layers").

Every quoted #include in src/, include/qvg/, tools/, bench/ and python/src/ is
checked against the layer of the including file:

  core     (src/core)                     core
  kernels  (src/kernels: ref, cpu, cuda)  core, kernels
  codec    (src/codec, src/codec/cuda)    core, kernels, codec
  cache    (src/cache, src/cache/cuda)    core, kernels, codec, cache
  io       (src/io)                       core, codec, io
  eval     (src/workload, baselines, memory, sim, perf)   everything above and eval
  tools    (tools/, bench/, python/src)   public headers (qvg/...) and eval

Public headers belong to a layer too (PUBLIC below, keyed by the path under
include/qvg) and may be included only from that layer or a higher one. Their folder
says who they are for: include/qvg/*.h is what a user links (layers core to io),
include/qvg/eval/ the evaluation layer's API (simulator, workload, memory model,
frontier, charts, comparison, baselines), include/qvg/detail/ test hooks; a header
of the evaluation layer outside eval/, or of another layer inside it, is a
violation, and so is a public header outside detail/ that includes a detail/ one. Besides includes, src/core must not call into qvg::kernels (no
`kernels::` in its code).

The build's libraries are checked too: every source file under src/ is listed in
exactly one library (CMakeLists.txt, cmake/QvgCuda.cmake), the core library
(qvg_core) holds only core, kernels (ref, cpu), codec, cache and io sources, the
CUDA library only src/kernels/cuda, src/codec/cuda and src/cache/cuda, and everything else (the
evaluation layer, benchmarks included) is in an evaluation library.

Exit status 1 and one line per violation when anything is wrong; prints a summary
line otherwise.
"""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Which layers a layer may use (itself included).
EVAL = {"workload", "baselines", "memory", "sim", "perf"}
ALLOWED = {
    "core": {"core"},
    "kernels": {"core", "kernels"},
    "codec": {"core", "kernels", "codec"},
    "cache": {"core", "kernels", "codec", "cache"},
    "io": {"core", "codec", "io"},
}
for e in EVAL:
    ALLOWED[e] = {"core", "kernels", "codec", "cache", "io"} | EVAL
ALLOWED["tools"] = EVAL  # plus public headers (checked separately) and their own files

# The layer of each public header (its path under include/qvg): what it declares.
PUBLIC = {
    "error.h": "core", "numeric.h": "core", "tensor.h": "core", "config.h": "core", "settings.h": "core", "file.h": "core",
    "encoding_layout.h": "core", "code_format.h": "core", "host_device.h": "core", "version.h": "core",
    # The CUDA backend's device runtime (streams, errors, allocator, device buffers).
    "cuda_runtime.h": "kernels",
    "codec.h": "codec",
    # The CUDA backend's codec (the device encoded tensor, encode, decode).
    "cuda.h": "codec",
    "cache.h": "cache", "cache_options.h": "cache", "view.h": "cache", "attention.h": "cache", "cuda_cache.h": "cache",
    "snapshot.h": "cache",
    "io.h": "io",
    # Test hooks (a cache's whole state as a value): not for users.
    "detail/test_access.h": "cache",
    # The evaluation tools' API: not part of what a user links (libqvg.a).
    "eval/workload.h": "workload", "eval/baselines.h": "baselines", "eval/memory.h": "memory",
    "eval/simulate.h": "sim", "eval/compare.h": "sim", "eval/frontier.h": "sim", "eval/chart.h": "sim",
    "eval/error_sums.h": "sim",
}
# Public headers a layer may include although they belong to a higher layer: none
# (the CUDA codec, which moves EncodedTensor between host and device, is in the codec
# layer: src/codec/cuda, qvg/cuda.h; the kernels see the device runtime only).
PUBLIC_EXCEPTIONS: dict[str, set[str]] = {}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def public_name(path: pathlib.Path) -> str:
    """A public header's name as included after "qvg/": its path under include/qvg."""
    return path.relative_to(ROOT / "include" / "qvg").as_posix()


def folder_rule(name: str) -> str | None:
    """What is wrong with where the public header `name` lies, or None."""
    layer = PUBLIC[name]
    if name.startswith("eval/") != (layer in EVAL):
        where = "include/qvg/eval/" if layer in EVAL else "include/qvg/ (what a user links)"
        return f"include/qvg/{name} is of layer {layer}: it belongs in {where}"
    if "/" in name and not name.startswith(("eval/", "detail/")):
        return f"include/qvg/{name}: public headers lie in include/qvg, include/qvg/eval or include/qvg/detail"
    return None


def layer_of(path: pathlib.Path) -> str | None:
    rel = path.relative_to(ROOT).parts
    if rel[0] == "src":
        return rel[1]
    if rel[0] == "include":
        return PUBLIC.get(public_name(path), "?")
    if rel[0] in ("tools", "bench") or rel[:2] == ("python", "src"):
        return "tools"
    return None


def public_allowed(layer: str, header: str) -> bool:
    target = PUBLIC.get(header)
    if target is None:
        return False
    if layer == "tools" or layer in EVAL:
        return True
    return target in ALLOWED[layer] or header in PUBLIC_EXCEPTIONS.get(layer, set())


# Which folders each library's sources may come from.
LIBRARIES = {
    "QVG_CORE_SOURCES": ("core", {"core", "kernels/ref", "kernels/cpu", "codec", "cache", "io"}),
    "QVG_WORKLOAD_SOURCES": ("eval", {"workload"}),
    "QVG_EVAL_SOURCES": ("eval", {"baselines", "memory", "sim", "perf"}),
    "QVG_CUDA_KERNEL_SOURCES": ("cuda", {"kernels/cuda"}),
    "QVG_CUDA_HOST_SOURCES": ("cuda", {"kernels/cuda", "codec/cuda", "cache/cuda"}),
    # Single-file evaluation libraries: the faiss peer and the GPU benchmarks.
    "add_library": ("eval", {"perf"}),
}


def check_libraries() -> list[str]:
    text = (ROOT / "CMakeLists.txt").read_text() + (ROOT / "cmake" / "QvgCuda.cmake").read_text()
    listed: dict[str, list[str]] = {}
    for var, (_, _) in LIBRARIES.items():
        if var == "add_library":
            pattern = r"add_library\(\w+\s+STATIC\s+\$\{PROJECT_SOURCE_DIR\}/(src/[^\s)]+)\)"
            srcs = re.findall(pattern, text)
        else:
            m = re.search(r"set\(" + var + r"\s+([^)]*)\)", text)
            srcs = m.group(1).split() if m else []
        for src in srcs:
            listed.setdefault(src, []).append(var)
    bad = []
    for src, vars_ in listed.items():
        if len(vars_) > 1:
            bad.append(f"{src} is listed in several libraries: {', '.join(vars_)}")
        folder = str(pathlib.PurePosixPath(src).parent)[len("src/"):]
        lib, folders = LIBRARIES[vars_[0]]
        if folder not in folders:
            bad.append(f"{src} (folder src/{folder}) is in the {lib} library ({vars_[0]}), which takes only "
                       f"{', '.join(sorted(folders))}")
        if not (ROOT / src).is_file():
            bad.append(f"{src} is listed in {vars_[0]} but does not exist")
    for f in sorted(ROOT.glob("src/**/*")):
        if f.suffix in {".cpp", ".cu"}:
            rel = str(f.relative_to(ROOT))
            if rel not in listed:
                bad.append(f"{rel} is in no library (list it in CMakeLists.txt or cmake/QvgCuda.cmake)")
    return bad


def main() -> int:
    files = []
    for pattern in ("src/**/*", "include/qvg/**/*.h", "tools/**/*", "bench/**/*", "python/src/**/*"):
        files += [p for p in ROOT.glob(pattern) if p.suffix in {".h", ".cpp", ".cu", ".cuh", ".in"} and p.is_file()]
    bad: list[str] = []
    checked = 0
    for f in sorted(set(files)):
        layer = layer_of(f)
        if layer is None:
            continue
        if layer == "?":
            bad.append(f"{f.relative_to(ROOT)}: a public header of no layer (add it to PUBLIC in scripts/check-layers.py)")
            continue
        if f.parts[len(ROOT.parts)] == "include" and (rule := folder_rule(public_name(f))):
            bad.append(rule)
        if layer not in ALLOWED and layer not in PUBLIC.values():
            bad.append(f"{f.relative_to(ROOT)}: folder src/{layer} belongs to no layer (add it to scripts/check-layers.py)")
            continue
        text = f.read_text(errors="replace")
        for m in INCLUDE.finditer(text):
            inc = m.group(1)
            checked += 1
            line = text.count("\n", 0, m.start()) + 1
            where = f"{f.relative_to(ROOT)}:{line}"
            if inc.startswith("qvg/"):
                header = inc[len("qvg/"):]
                if not public_allowed(layer, header):
                    bad.append(f'{where}: layer {layer} includes "{inc}" (layer {PUBLIC.get(header, "unknown")})')
                elif (header.startswith("detail/") and f.parts[len(ROOT.parts)] == "include"
                      and not public_name(f).startswith("detail/")):
                    bad.append(f'{where}: a public header includes the test hook "{inc}"')
                continue
            top = inc.split("/", 1)[0]
            if "/" not in inc or not (ROOT / "src" / top).is_dir():
                continue  # a header of the file's own folder (tools/qvg/command.h) or a library's ("hwy/...")
            if f.parts[len(ROOT.parts)] == "include":
                bad.append(f'{where}: public header includes "{inc}" from src/')
            elif top not in ALLOWED.get(layer, set()):
                bad.append(f'{where}: layer {layer} includes "{inc}" (layer {top})')
        if layer == "core" and f.parts[len(ROOT.parts)] == "src":
            code = re.sub(r"//[^\n]*", "", text)
            for m in re.finditer(r"\bkernels::", code):
                bad.append(f"{f.relative_to(ROOT)}:{code.count(chr(10), 0, m.start()) + 1}: core calls into kernels::")
    bad += check_libraries()
    for b in bad:
        print(f"check-layers: {b}", file=sys.stderr)
    if bad:
        print(f"check-layers: {len(bad)} violation(s) of the layering (docs/design.md)", file=sys.stderr)
        return 1
    print(f"check-layers: {checked} includes in {len(set(files))} files point down only; every source of src/ is "
          f"in one library of its layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
