#!/usr/bin/env python3
"""How the step benchmark (bench/step_bench.py, issue 37) imports the engine's own cache
classes on a machine without the engine installed: the device image has torch and Triton
but not SGLang, and nothing can be installed there.

The engine's packed cache (``QVGPackedCausalKVCache``) and dense cache
(``CausalSelfAttentionKVCache``) live in four modules of SGLang 0.5.23 that import only
torch, the standard library and each other (and, for the codec, quant-videogen, which
python/gpu/refload.py loads). ``scripts/gpu-deps.sh`` extracts exactly those files from
the pinned SGLang wheel into ``.gpudeps/engine/`` (ignored by git, carried to the device
like the rest of ``.gpudeps``); ``load_engine_caches()`` imports them from there under
stub parent packages, so that SGLang's package ``__init__`` files (which import its whole
serving stack) never run. Where SGLang is installed (the test environment), the same
four files are taken from the installed package and loaded the same way: the CPU
rehearsal runs the device's import path.

``python3 python/gpu/engineload.py --check`` loads them and prints where from; exit 1 when
they cannot be found.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ENGINE_VERSION = "0.5.23"

# The engine's modules the caches need, in import order (SGLang 0.5.23, the version the
# compat suite pins; file_digests() reports what was loaded).
MODULES = (
    "sglang.multimodal_gen.configs.quantization.qvg_kv",
    "sglang.multimodal_gen.runtime.utils.logging_utils",
    "sglang.multimodal_gen.runtime.layers.kvcache.causal_attention_cache",
    "sglang.multimodal_gen.runtime.layers.kvcache.qvg_packed_cache",
)


def _relpath(module: str) -> str:
    return module.replace(".", "/") + ".py"


def source_dir() -> Path | None:
    """Where the engine's files are: $QVG_ENGINE_DIR, .gpudeps/engine, or the installed
    SGLang (found without importing it); None when none holds all four files."""
    candidates = []
    if os.environ.get("QVG_ENGINE_DIR"):
        candidates.append(Path(os.environ["QVG_ENGINE_DIR"]))
    candidates.append(ROOT / ".gpudeps" / "engine")
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        candidates.append(Path(list(spec.submodule_search_locations)[0]).parent)
    for c in candidates:
        if all((c / _relpath(m)).is_file() for m in MODULES):
            return c
    return None


def _stub_packages(module: str) -> None:
    """Empty parent packages of `module` (their __init__ files are not run)."""
    parts = module.split(".")
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = []  # a package, searched by nothing: only what is loaded here exists
            sys.modules[name] = pkg


def load_engine_caches() -> types.SimpleNamespace:
    """The engine's cache classes and quantization settings: a namespace with
    ``QVGPackedCausalKVCache``, ``CausalSelfAttentionKVCache``, ``QVGKVQuantArgs``,
    ``packed_module`` (to replace its ``_qvg_functions`` on the CPU) and ``source``.
    Already loaded (or SGLang imported normally): those modules are reused."""
    src = source_dir()
    if src is None and not all(m in sys.modules for m in MODULES):
        raise ImportError("the engine's cache modules (sglang " + ENGINE_VERSION + ") were not found: run "
                          "scripts/gpu-deps.sh (fills .gpudeps/engine) or install sglang, or set QVG_ENGINE_DIR")
    for m in MODULES:
        if m in sys.modules:
            continue
        _stub_packages(m)
        path = src / _relpath(m)
        spec = importlib.util.spec_from_file_location(m, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[m] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[m]
            raise
    packed = sys.modules["sglang.multimodal_gen.runtime.layers.kvcache.qvg_packed_cache"]
    dense = sys.modules["sglang.multimodal_gen.runtime.layers.kvcache.causal_attention_cache"]
    config = sys.modules["sglang.multimodal_gen.configs.quantization.qvg_kv"]
    return types.SimpleNamespace(QVGPackedCausalKVCache=packed.QVGPackedCausalKVCache,
                                 CausalSelfAttentionKVCache=dense.CausalSelfAttentionKVCache,
                                 QVGKVQuantArgs=config.QVGKVQuantArgs, packed_module=packed,
                                 source=str(src) if src else "already imported")


def file_digests(src: Path) -> dict[str, str]:
    """SHA-256 of each of the four files under `src` (for the benchmark's output)."""
    return {m: hashlib.sha256((src / _relpath(m)).read_bytes()).hexdigest()[:16] for m in MODULES}


if __name__ == "__main__":
    if sys.argv[1:] != ["--check"]:
        print("usage: engineload.py --check", file=sys.stderr)
        sys.exit(2)
    try:
        e = load_engine_caches()
    except ImportError as err:
        print(f"engineload: {err}", file=sys.stderr)
        sys.exit(1)
    print(f"engineload: the engine's caches from {e.source}")
