"""qvg.sglang — one call to make the SGLang engine allocate qvg's caches.

The engine's multimodal runtime builds its causal K/V caches in its denoising stages
(``CausalDMDDenoisingStage._allocate_causal_kv_cache`` and the LingBot stage's
override), by the names ``CausalSelfAttentionKVCache`` and ``QVGPackedCausalKVCache``
that those stage modules import from
``sglang.multimodal_gen.runtime.layers.kvcache.causal_attention_cache`` and
``...kvcache.qvg_packed_cache``. :func:`install` rebinds those names to
:mod:`qvg.torch`'s classes wherever the engine holds them:

* in the two defining modules and the ``kvcache`` package, so that engine modules
  imported afterwards get qvg's classes;
* in every ``sglang.*`` module already imported that bound the originals (the stage
  modules, the DiT models' type checks), and in type unions built from them (the
  stages' ``CausalKVCache = CausalSelfAttentionKVCache | QVGPackedCausalKVCache``).

:func:`uninstall` puts the engine's classes back in every ``sglang.*`` module holding
qvg's (including modules imported while installed); :func:`installed` is a context
manager doing both::

    import qvg.sglang
    qvg.sglang.install()          # before or after the engine's modules are imported
    ...                           # the engine now allocates qvg caches
    qvg.sglang.uninstall()

    with qvg.sglang.installed():
        ...

The packed cache where the engine refuses it (issue 26): SGLang 0.5.23 allocates its
packed cache only in the LingBot-World stage; its base causal stage
(``CausalDMDDenoisingStage``: Self-Forcing's causal Wan, and LongLive2's stage, which
inherits it) always allocates dense caches and refuses ``kv_cache_quant_config`` in
its realtime path (``_supports_qvg_kv_cache_quantization()`` is False). While
installed, and when the engine's stage module imports, :func:`install` also replaces
those two methods of ``CausalDMDDenoisingStage`` (subclasses that define their own,
as the LingBot stage does, keep theirs): the stage supports quantization, and its
allocation builds ``QVGPackedCausalKVCache`` (qvg's, by the rebinding above) with the
stage's settings (``self._kv_quant_args`` where the stage set it, else its server
args' ``kv_cache_quant_config``) when they are enabled, its dense caches otherwise.
LongLive2's pinned multi-shot sink (``global_sink_tokens``) and ``allow_growth`` are
not supported by qvg's packed cache: that allocation raises NotImplementedError,
as the LingBot stage's does. :func:`stage_patched` says whether the stage module
was found.

The engine's ``QVGKVQuantArgs`` is left alone: qvg's packed cache takes the engine's
settings object as is (missing qvg extensions take their defaults). The differences
in behaviour from the engine's caches are listed in docs/compat.md.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from typing import Any

from . import torch as _qt
from ._rebind import rebind

__all__ = ["install", "uninstall", "installed", "is_installed", "ENGINE_MODULES", "STAGE_MODULE", "stage_patched"]

_DENSE = "sglang.multimodal_gen.runtime.layers.kvcache.causal_attention_cache"
_PACKED = "sglang.multimodal_gen.runtime.layers.kvcache.qvg_packed_cache"
_PACKAGE = "sglang.multimodal_gen.runtime.layers.kvcache"

#: The engine modules defining the replaced names: (module, name) pairs.
ENGINE_MODULES: tuple[tuple[str, str], ...] = (
    (_DENSE, "CausalSelfAttentionKVCache"),
    (_PACKED, "QVGPackedCausalKVCache"),
)

_SUBSTITUTES: dict[str, type] = {
    "CausalSelfAttentionKVCache": _qt.CausalSelfAttentionKVCache,
    "QVGPackedCausalKVCache": _qt.QVGPackedCausalKVCache,
}

_originals: dict[str, type] = {}  # name -> the engine's class, while installed

#: The engine module of the base causal denoising stage (its class CausalDMDDenoisingStage).
STAGE_MODULE = "sglang.multimodal_gen.runtime.pipelines_core.stages.causal_denoising"
_STAGE_CLASS = "CausalDMDDenoisingStage"
_stage_originals: dict[str, Any] = {}  # method name -> the engine's function, while patched


def _stage_quant_args(stage: Any) -> Any:
    """The stage's K/V quantization settings: ``_kv_quant_args`` where the stage set it
    (the LingBot stage's realtime path), else its server args' ``kv_cache_quant_config``."""
    quant = getattr(stage, "_kv_quant_args", None)
    if quant is None:
        quant = getattr(getattr(stage, "server_args", None), "kv_cache_quant_config", None)
    return quant


def _supports_qvg_kv_cache_quantization(self: Any) -> bool:
    """qvg.sglang: every causal stage supports the packed cache."""
    return True


def _allocate_causal_kv_cache(self: Any, *, batch_size: int, kv_cache_size: int, num_attention_heads: int,
                              attention_head_dim: int, dtype: Any, device: Any, use_int_indices: bool = False,
                              sink_tokens: int = 0, global_sink_tokens: int = 0,
                              attention_window_size: int | None = None, allow_growth: bool = False) -> list:
    """qvg.sglang: the engine's dense allocation, or packed caches when the stage's
    quantization settings are enabled (module docstring)."""
    quant = _stage_quant_args(self)
    if quant is None or not getattr(quant, "enabled", False):
        return _stage_originals["_allocate_causal_kv_cache"](
            self, batch_size=batch_size, kv_cache_size=kv_cache_size, num_attention_heads=num_attention_heads,
            attention_head_dim=attention_head_dim, dtype=dtype, device=device, use_int_indices=use_int_indices,
            sink_tokens=sink_tokens, global_sink_tokens=global_sink_tokens,
            attention_window_size=attention_window_size, allow_growth=allow_growth)
    if global_sink_tokens or allow_growth:
        raise NotImplementedError(
            f"{type(self).__name__}: qvg's packed K/V cache does not support the pinned multi-shot sink "
            f"(global_sink_tokens={global_sink_tokens}) or allow_growth={allow_growth}; turn K/V quantization off "
            "(kv_cache_quant_config) or the multi-shot sink off for this request")
    import torch

    packed_cls = sys.modules[STAGE_MODULE].QVGPackedCausalKVCache  # qvg's while installed
    return [
        packed_cls(batch_size=batch_size, cache_size=kv_cache_size, num_heads=num_attention_heads,
                   head_dim=attention_head_dim, dtype=dtype, device=device, use_int_indices=use_int_indices,
                   global_end_index=torch.zeros(1, dtype=torch.long, device=device),
                   local_end_index=torch.zeros(1, dtype=torch.long, device=device), sink_tokens=sink_tokens,
                   attention_window_size=kv_cache_size if attention_window_size is None else attention_window_size,
                   quant_args=quant)
        for _ in range(self.num_transformer_blocks)
    ]


_STAGE_SUBSTITUTES = {
    "_supports_qvg_kv_cache_quantization": _supports_qvg_kv_cache_quantization,
    "_allocate_causal_kv_cache": _allocate_causal_kv_cache,
}


def _patch_stage() -> bool:
    """Replaces the base stage's two methods (idempotent); False when its module does
    not import (the engine without its serving dependencies)."""
    if _stage_originals:
        return True
    try:
        module = importlib.import_module(STAGE_MODULE)
    except ImportError:
        return False
    cls = getattr(module, _STAGE_CLASS)
    for name, fn in _STAGE_SUBSTITUTES.items():
        _stage_originals[name] = cls.__dict__[name]
        setattr(cls, name, fn)
    return True


def _unpatch_stage() -> None:
    if not _stage_originals:
        return
    cls = getattr(sys.modules[STAGE_MODULE], _STAGE_CLASS)
    for name, fn in _stage_originals.items():
        if cls.__dict__.get(name) is _STAGE_SUBSTITUTES[name]:
            setattr(cls, name, fn)
    _stage_originals.clear()


def stage_patched() -> bool:
    """True while the base causal stage's methods are qvg.sglang's (installed, and the
    engine's stage module imported)."""
    return bool(_stage_originals)


def _engine_originals() -> dict[str, type]:
    """The engine's classes, imported from their defining modules."""
    out = {}
    for module_name, name in ENGINE_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ImportError(
                f"qvg.sglang needs the SGLang engine's module {module_name} (pip install sglang); importing it "
                f"failed: {e}"
            ) from e
        out[name] = getattr(module, name)
    return out


def is_installed() -> bool:
    """True between :func:`install` and :func:`uninstall`."""
    return bool(_originals)


def install() -> None:
    """Makes the engine allocate qvg's caches: rebinds ``CausalSelfAttentionKVCache``
    and ``QVGPackedCausalKVCache`` to :mod:`qvg.torch`'s in the engine's modules, and
    lets the base causal stage allocate the packed cache (see the module docstring).
    Idempotent. Raises ImportError when the engine's cache modules cannot be imported
    (a stage module that cannot be imported only leaves the stage as it is:
    :func:`stage_patched` is False)."""
    if _originals:
        return
    originals = _engine_originals()
    _patch_stage()  # imports the stage module first, so that the rebinding below reaches it
    _originals.update(originals)
    rebind("sglang", {originals[name]: _SUBSTITUTES[name] for name in originals})


def uninstall() -> None:
    """Restores the engine's classes in every ``sglang.*`` module that holds qvg's
    (also modules imported while installed). A no-op when not installed."""
    if not _originals:
        return
    rebind("sglang", {_SUBSTITUTES[name]: cls for name, cls in _originals.items()})
    _originals.clear()
    _unpatch_stage()


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Context manager: :func:`install` on entry, :func:`uninstall` on exit (also when
    the block raises). Entering while already installed leaves it installed on exit."""
    was = is_installed()
    install()
    try:
        yield
    finally:
        if not was:
            uninstall()
