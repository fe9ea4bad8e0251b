"""Shared helpers of the conformance tests against the real serving engine (SGLang)
and the reference codec (quant-videogen): docs/compat.md.

The engine is installed by scripts/python.sh from python/requirements-compat.txt
(pinned, --no-deps); where it is missing the compat tests are skipped.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

import pytest

ENGINE_KVCACHE = "sglang.multimodal_gen.runtime.layers.kvcache.causal_attention_cache"
ENGINE_PACKED = "sglang.multimodal_gen.runtime.layers.kvcache.qvg_packed_cache"
ENGINE_QUANT = "sglang.multimodal_gen.configs.quantization.qvg_kv"


def import_engine(name: str) -> ModuleType:
    """One of the engine's modules, or skips the test when the engine is not installed."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # requests' dependency warning and the like
            return importlib.import_module(name)
    except ImportError as e:  # pragma: no cover - only without the compat requirements
        pytest.skip(f"the engine is not installed ({e}); scripts/python.sh installs python/requirements-compat.txt")


# ---------------------------------------------------------------------------
# The reference codec's dequantizer
# ---------------------------------------------------------------------------

_REFERENCE: dict = {}


def _function_source(path, name: str) -> str:
    import ast

    text = path.read_text()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return "\n".join(text.splitlines()[node.lineno - 1:node.end_lineno])
    raise RuntimeError(f"{path}: no function {name}")


class _FixedConfig:
    """Stands in for a triton.autotune wrapper: launches the wrapped kernel with one
    fixed config (the autotuner benchmarks every config, which needs a GPU driver)."""

    def __init__(self, tuner, config: dict) -> None:
        self.tuner, self.config = tuner, config

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            g = grid(self.config) if callable(grid) else grid
            return self.tuner.fn[g](*args, **kwargs, **self.config)
        return launch


def reference_dequantize():
    """quant-videogen's ``triton_prq_dequantize_tensor`` and how it runs here.

    Where ``quant_videogen.functions`` imports (Triton 3.6, the GPU image), that
    function itself. Here (Triton 3.9 on the CPU) the package cannot be imported: its
    ``kernels/triton/permute.py`` and ``real/smooth.py`` autotune on a key that is not a
    kernel argument, which Triton 3.9 rejects at import. The dequantize direction needs
    neither: ``real/accumulate.py`` (its kernel ``_nstage_accum_kernel`` and wrapper
    ``nstage_accum``) is imported on its own, without the package's ``__init__``, with
    ``TRITON_INTERPRET=1`` (Triton's interpreter runs the kernel on the CPU with
    numpy) and the autotuner replaced by one fixed config (BLOCK_S 32; the kernel's
    result does not depend on it); ``prq_dequant`` and ``triton_prq_dequantize_tensor``
    are executed from the reference's source files, unchanged. Returns (function,
    description); skips the test when quant-videogen is not installed."""
    if _REFERENCE:
        return _REFERENCE["fn"], _REFERENCE["how"]
    import importlib.util
    import os
    import sys
    from pathlib import Path

    spec = importlib.util.find_spec("quant_videogen")
    if spec is None:
        pytest.skip("quant-videogen is not installed; scripts/python.sh installs python/requirements-compat.txt")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from quant_videogen.functions import triton_prq_dequantize_tensor  # type: ignore
        _REFERENCE.update(fn=triton_prq_dequantize_tensor, how="quant_videogen.functions (imported)")
        return _REFERENCE["fn"], _REFERENCE["how"]
    except Exception:  # noqa: BLE001 - the Triton 3.9 import failure: the CPU route below
        for name in [m for m in sys.modules if m == "quant_videogen" or m.startswith("quant_videogen.")]:
            del sys.modules[name]
    import types

    root = Path(spec.submodule_search_locations[0])
    pkg = types.ModuleType("quant_videogen")
    pkg.__path__ = [str(root)]
    sys.modules["quant_videogen"] = pkg  # the package without its __init__
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        acc = importlib.import_module("quant_videogen.real.accumulate")
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old
    acc._nstage_accum_kernel = _FixedConfig(acc._nstage_accum_kernel, {"BLOCK_S": 32})
    import torch

    ns: dict = {"torch": torch, "nstage_accum": acc.nstage_accum, "percentile_unscale_and_add_residual": None}
    exec(_function_source(root / "real" / "prq.py", "prq_dequant"), ns)
    exec(_function_source(root / "functions.py", "triton_prq_dequantize_tensor"), ns)
    _REFERENCE.update(fn=ns["triton_prq_dequantize_tensor"],
                      how="quant-videogen source on the CPU (Triton interpreter, accumulate.py imported alone)")
    return _REFERENCE["fn"], _REFERENCE["how"]
