"""Test shim: the engine's denoising-stage modules, reduced to their cache code.

The engine's unit test for its packed cache (sglang/multimodal_gen/test/unit/
test_qvg_packed_kv.py) and qvg.sglang's tests need
``sglang.multimodal_gen.runtime.pipelines_core.stages.causal_denoising`` and
``...model_specific_stages.lingbot_world.lingbot_world_causal_denoising``. Importing
those for real needs the whole serving stack (safetensors, tvm_ffi, transformers'
configs through sglang.srt, ...), far beyond the compat requirements (the e2e
requirements, python/requirements-e2e.txt, bring it: then the real modules are used
and nothing here is). Otherwise this shim registers, under the real module names,
modules holding:

* the cache names the real modules import (``torch``, ``CausalSelfAttentionKVCache``,
  ``QVGPackedCausalKVCache``, ``QVGKVQuantArgs``, ``CausalKVCache``), imported from the
  engine's modules exactly as the real stage modules do (so qvg.sglang.install()
  rebinds them the same way);
* the stage classes with only these methods, whose source is copied verbatim from the
  installed engine files (parsed with ``ast``): ``_allocate_causal_kv_cache``,
  ``_apply_causal_cache_overrides`` (CausalDMDDenoisingStage only) and
  ``_supports_qvg_kv_cache_quantization``. Everything else of the stages is absent.

Parent packages that cannot be imported (``pipelines_core`` needs safetensors) are
registered as empty packages. docs/compat.md lists what is stubbed.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import types
from pathlib import Path

STAGES = "sglang.multimodal_gen.runtime.pipelines_core.stages"
CAUSAL = STAGES + ".causal_denoising"
LINGBOT = STAGES + ".model_specific_stages.lingbot_world.lingbot_world_causal_denoising"

_PRELUDE = """\
from typing import Any
import torch
from sglang.multimodal_gen.configs.quantization.qvg_kv import QVGKVQuantArgs
from sglang.multimodal_gen.runtime.layers.kvcache.causal_attention_cache import CausalSelfAttentionKVCache
from sglang.multimodal_gen.runtime.layers.kvcache.qvg_packed_cache import QVGPackedCausalKVCache
CausalKVCache = CausalSelfAttentionKVCache | QVGPackedCausalKVCache
Req = ServerArgs = Any  # annotations only
"""

#: module -> (class, base expression, methods copied from the engine's source)
_CLASSES = {
    CAUSAL: ("CausalDMDDenoisingStage", "", ("_allocate_causal_kv_cache", "_apply_causal_cache_overrides",
                                              "_supports_qvg_kv_cache_quantization")),
    LINGBOT: ("LingBotWorldCausalDMDDenoisingStage", "CausalDMDDenoisingStage",
              ("_allocate_causal_kv_cache", "_supports_qvg_kv_cache_quantization")),
}

#: What the shim stubs (reported by the tests and docs/compat.md).
STUBBED = (
    f"{CAUSAL}: only CausalDMDDenoisingStage._allocate_causal_kv_cache, _apply_causal_cache_overrides, "
    "_supports_qvg_kv_cache_quantization (engine source)",
    f"{LINGBOT}: only LingBotWorldCausalDMDDenoisingStage._allocate_causal_kv_cache, "
    "_supports_qvg_kv_cache_quantization (engine source)",
    "their parent packages, when not importable: empty packages",
)


def _engine_file(module: str) -> Path:
    """The installed source file of an engine module, found without importing it."""
    parent, _, leaf = module.rpartition(".")
    root = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
    return root.joinpath(*parent.split(".")[1:], leaf + ".py")


def _method_sources(path: Path, cls: str, methods: tuple[str, ...]) -> str:
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            found = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in methods:
                    start = min([d.lineno for d in item.decorator_list] + [item.lineno])
                    found[item.name] = "\n".join(lines[start - 1:item.end_lineno])
            missing = set(methods) - set(found)
            if missing:
                raise RuntimeError(f"{path}: {cls} lacks {sorted(missing)}")
            return "\n\n".join(found[m] for m in methods)
    raise RuntimeError(f"{path}: no class {cls}")


def _ensure_package(name: str) -> None:
    if name in sys.modules:
        return
    parent = name.rpartition(".")[0]
    if parent:
        _ensure_package(parent)
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - any failure: an empty package in its place
        pkg = types.ModuleType(name)
        pkg.__path__ = []
        pkg.__qvg_shim__ = True
        sys.modules[name] = pkg
        if parent:
            setattr(sys.modules[parent], name.rpartition(".")[2], pkg)


def load_stage_modules() -> tuple[types.ModuleType, types.ModuleType]:
    """The causal_denoising and LingBot stage modules: the engine's own where they import
    (with python/requirements-e2e.txt installed), else the reduced ones, registered once."""
    out = []
    for module_name in (CAUSAL, LINGBOT):
        existing = sys.modules.get(module_name)
        if existing is None:
            try:  # the real module where the serving stack is installed (python/requirements-e2e.txt)
                existing = importlib.import_module(module_name)
            except Exception:  # noqa: BLE001 - any failure: the reduced module below
                existing = None
        if existing is not None:
            out.append(existing)
            continue
        _ensure_package(module_name.rpartition(".")[0])
        cls, base, methods = _CLASSES[module_name]
        source = _PRELUDE
        if base:
            source += f"from {CAUSAL} import {base}\n"
        source += f"\n\nclass {cls}({base}):\n" + _method_sources(_engine_file(module_name), cls, methods) + "\n"
        module = types.ModuleType(module_name)
        module.__file__ = str(_engine_file(module_name))
        module.__qvg_shim__ = True
        sys.modules[module_name] = module
        exec(compile(source, f"<qvg shim of {module_name}>", "exec"), module.__dict__)
        parent, _, leaf = module_name.rpartition(".")
        setattr(sys.modules[parent], leaf, module)
        out.append(module)
    return out[0], out[1]


def load_engine_unit_test() -> types.ModuleType:
    """The engine's own test module test_qvg_packed_kv.py, executed now (its imports
    resolve to whatever the engine's modules hold at this moment)."""
    load_stage_modules()
    path = _engine_file("sglang.multimodal_gen.test.unit.test_qvg_packed_kv")
    module = types.ModuleType("engine_test_qvg_packed_kv")
    module.__file__ = str(path)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module
