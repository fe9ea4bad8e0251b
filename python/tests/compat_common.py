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
