"""Loads vLLM-Omni's LingBot-World transformer module on the CPU (docs/engines.md).

``vllm_omni.diffusion.models.lingbot_world.transformer`` cannot be imported here: it
imports vLLM, whose only PyPI build (0.30.0, the version vllm-omni 0.30.0 runs with)
is a CUDA build pinned to torch==2.13.0, while qvg's test environment pins torch
2.15.0; and the package ``__init__`` files above it import the pipeline (diffusers,
aenum, ...). The module itself is loaded here from the pinned wheel's file, unchanged,
under its real name, with two shims:

* the packages above it (``vllm_omni``, ``vllm_omni.diffusion``,
  ``vllm_omni.diffusion.models``, ``vllm_omni.diffusion.models.lingbot_world``) are
  registered without running their ``__init__`` (their search path is the wheel's);
* each module it imports from vLLM or from vllm-omni modules that need vLLM
  (:data:`SHIMMED`) is a stub whose names are placeholder classes that raise when
  used (but the sequence-parallel plan's records, built in a class body). The module
  otherwise uses them only inside the layers' constructors and forward passes: ``LingBotAttentionCache``,
  ``LingBotTransformerCache``, ``allocate_lingbot_cache`` and
  ``LingBotSelfAttention._update_cache`` (the request-path cache qvg.vllm_omni serves)
  are pure torch and run as shipped. The model's layers cannot be built here.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import types

import pytest

MODULE = "vllm_omni.diffusion.models.lingbot_world.transformer"
_PACKAGES = ("vllm_omni", "vllm_omni.diffusion", "vllm_omni.diffusion.models",
             "vllm_omni.diffusion.models.lingbot_world")

#: The modules the transformer imports that need vLLM (the first group is vLLM, the
#: second vllm-omni's own modules that import it), each replaced by a stub.
SHIMMED = (
    "vllm", "vllm.distributed", "vllm.model_executor", "vllm.model_executor.layers",
    "vllm.model_executor.layers.conv", "vllm.model_executor.layers.linear", "vllm.model_executor.model_loader",
    "vllm.model_executor.model_loader.weight_utils", "vllm.model_executor.utils",
    "vllm_omni.diffusion.attention", "vllm_omni.diffusion.attention.layer", "vllm_omni.diffusion.distributed",
    "vllm_omni.diffusion.distributed.comm", "vllm_omni.diffusion.distributed.parallel_state",
    "vllm_omni.diffusion.distributed.sp_plan", "vllm_omni.diffusion.layers", "vllm_omni.diffusion.layers.norm",
    "vllm_omni.diffusion.layers.rope", "vllm_omni.experimental", "vllm_omni.experimental.ar_diffusion",
    "vllm_omni.experimental.ar_diffusion.kv_cache", "vllm_omni.experimental.ar_diffusion.kv_cache.paged_attention",
)


# Names the module instantiates in a class body (the model's sequence-parallel plan,
# plain records): their placeholders accept construction (and keep the arguments).
_RECORDS = frozenset({"SequenceParallelInput", "SequenceParallelOutput"})


class _Stub(types.ModuleType):
    """A shimmed module: every name is a placeholder class that refuses to be used
    (built or called), but for the records of :data:`_RECORDS`, which can be built."""

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        module = self.__name__

        def refuse(*_a, **_k):
            raise RuntimeError(f"{module}.{name} is a test shim (vLLM is not importable here): "
                               "python/tests/vllm_omni_shim.py")

        def record(self, *args, **kwargs):
            self.args, self.kwargs = args, kwargs

        placeholder = type(name, (), {"__init__": record if name in _RECORDS else refuse, "__call__": refuse,
                                      "__module__": module})
        setattr(self, name, placeholder)
        return placeholder


_loaded: dict[str, types.ModuleType] = {}


def load() -> types.ModuleType:
    """The engine's transformer module (loaded once), or skips when vllm-omni is not installed."""
    if MODULE in _loaded:
        return _loaded[MODULE]
    try:
        dist = importlib.metadata.distribution("vllm-omni")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("vllm-omni is not installed; scripts/python.sh installs python/requirements-compat.txt")
    root = dist.locate_file("vllm_omni")
    saved = {name: sys.modules.get(name) for name in SHIMMED + _PACKAGES + (MODULE,)}
    try:
        for name in _PACKAGES:
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = pkg
        for name in SHIMMED:
            sys.modules[name] = _Stub(name)
        path = root.joinpath("diffusion", "models", "lingbot_world", "transformer.py")
        spec = importlib.util.spec_from_file_location(MODULE, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[MODULE] = module
        spec.loader.exec_module(module)
    finally:
        # the stubs and bare packages are needed only while the module executes; the
        # module stays registered under its real name (qvg.vllm_omni.install() imports it)
        for name, old in saved.items():
            if name == MODULE:
                continue
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    _loaded[MODULE] = module
    return module
