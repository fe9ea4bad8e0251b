#!/usr/bin/env python3
"""How scripts/gpu-check imports the reference codec quant-videogen 0.1.0 (docs/cuda.md).

The device image has torch, Triton and einops but not the reference's other
dependencies (termcolor, loguru), and nothing can be installed there. So the
reference and every pure-Python dependency it imports are shipped as pinned wheels
in python/gpu/wheels (WHEELS below, with their SHA-256); ``load_reference()``
extracts them into one directory, puts it first on ``sys.path`` and imports
``quant_videogen.functions`` without running the package's ``__init__`` (which
imports the whole package: loguru's logger, the KV-cache helpers). The shipped
termcolor, loguru and einops are importable too, so a path that does run the
``__init__`` would work as well.

``python3 python/gpu/refload.py --check PART...`` imports every module the named
parts of gpu-check import (``MODULES``), the reference exactly as the parts load
it: what ``gpu-check --dry-run`` (and the CPU rehearsal) runs. Exit status 1 when
one is missing, with one line per missing module.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
WHEEL_DIR = HERE / "wheels"

# The wheels gpu-check ships to the device (pinned; py3-none-any; SHA-256 of the file).
WHEELS = {
    "quant_videogen-0.1.0-py3-none-any.whl": "ea6e57660221dae5c104c036b13e3e92beb8e5bb484ea7c321f8945d10c89de9",
    "termcolor-3.3.0-py3-none-any.whl": "cf642efadaf0a8ebbbf4bc7a31cec2f9b5f21a9f726f4ccbb08192c9c26f43a5",
    "loguru-0.7.3-py3-none-any.whl": "31a33c10c8e1e10422bfd431aeb5d351c7cf7fa671e3c4df004162264b28220c",
    "einops-0.8.1-py3-none-any.whl": "919387eb55330f5757c6bea9165c5ff5cfe63a642682ea788a6d472576d81737",
}

# The modules each part of gpu-check imports (besides the standard library).
# "qvg" is the extension gpu-check builds: checked only after the build.
MODULES = {
    "summary": [],
    "reference": ["torch", "triton", "triton.language", "einops", "termcolor", "loguru",
                  "quant_videogen.functions"],
    "compat": ["torch", "triton", "quant_videogen.functions", "qvg.torch", "qvg._C"],
    "python": ["torch", "pytest", "numpy", "qvg.torch", "qvg._C"],
}


def check_wheels() -> list[str]:
    """Problems with the shipped wheels (missing, or not the pinned bytes)."""
    problems = []
    for name, sha in WHEELS.items():
        p = WHEEL_DIR / name
        if not p.is_file():
            problems.append(f"wheel {name} missing from {WHEEL_DIR}")
        elif hashlib.sha256(p.read_bytes()).hexdigest() != sha:
            problems.append(f"wheel {name} is not the pinned file (SHA-256 differs)")
    return problems


def extract_wheels(target: Path | None = None) -> Path:
    """Extracts the pinned wheels into `target` (default: $QVG_REF_DIR, else a new
    temporary directory) and puts it first on sys.path."""
    if target is None:
        env = os.environ.get("QVG_REF_DIR")
        target = Path(env) if env else Path(tempfile.mkdtemp(prefix="qvg-ref-"))
    target.mkdir(parents=True, exist_ok=True)
    for name in WHEELS:
        with zipfile.ZipFile(WHEEL_DIR / name) as z:
            z.extractall(target)
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    return target


def load_reference() -> tuple[Callable, Callable, str]:
    """(triton_prq_quantize_tensor, triton_prq_dequantize_tensor, how): always the
    shipped wheel (never another installed copy), its package ``__init__`` skipped."""
    problems = check_wheels()
    if problems:
        raise ImportError("; ".join(problems))
    for name in [m for m in sys.modules if m == "quant_videogen" or m.startswith("quant_videogen.")]:
        del sys.modules[name]
    target = extract_wheels()
    pkg = types.ModuleType("quant_videogen")  # without its __init__
    pkg.__path__ = [str(target / "quant_videogen")]
    sys.modules["quant_videogen"] = pkg
    functions = importlib.import_module("quant_videogen.functions")
    return (functions.triton_prq_quantize_tensor, functions.triton_prq_dequantize_tensor,
            f"python/gpu/wheels extracted to {target}, package __init__ skipped")


def check(parts: list[str]) -> list[str]:
    """Imports every module of `parts`; returns one line per module that failed."""
    missing = []
    need_ref = any("quant_videogen.functions" in MODULES[p] for p in parts)
    if need_ref:
        try:
            load_reference()
        except Exception as e:  # noqa: BLE001
            missing.append(f"reference: quant_videogen.functions: {type(e).__name__}: {e}")
    for part in parts:
        for mod in MODULES[part]:
            if mod == "quant_videogen.functions":
                continue
            try:
                importlib.import_module(mod)
            except Exception as e:  # noqa: BLE001
                missing.append(f"{part}: {mod}: {type(e).__name__}: {e}")
    return missing


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--check" or any(p not in MODULES for p in argv[1:]):
        print(f"usage: refload.py --check PART... (parts: {', '.join(MODULES)})", file=sys.stderr)
        return 2
    missing = check(argv[1:])
    for line in missing:
        print(f"refload: missing: {line}")
    if not missing:
        print(f"refload: every module of {', '.join(argv[1:])} imports "
              f"({sum(len(MODULES[p]) for p in argv[1:])} modules)")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
