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

The packed cache where the engine refuses it (docs/engines.md, "SGLang"): SGLang 0.5.23
allocates its packed cache only in the LingBot-World stage; its base causal stage
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
settings object as is (missing qvg extensions take their defaults), unless
``install(quant_args=...)`` gave settings, which then replace the engine's.
install / uninstall / installed keep the contract of every qvg drop-in
(:mod:`qvg.dropin`): all-or-nothing, idempotent, thread-safe, nestable, settings
passed one way (``quant_args``). The differences
in behaviour from the engine's caches are listed in docs/compat.md.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from . import dropin as _dropin
from . import torch as _qt

__all__ = ["install", "uninstall", "installed", "is_installed", "ENGINE_MODULES", "STAGE_MODULE", "stage_patched"]

_DENSE = "sglang.multimodal_gen.runtime.layers.kvcache.causal_attention_cache"
_PACKED = "sglang.multimodal_gen.runtime.layers.kvcache.qvg_packed_cache"
_PACKAGE = "sglang.multimodal_gen.runtime.layers.kvcache"

#: The engine modules defining the replaced names: (module, name) pairs.
ENGINE_MODULES: tuple[tuple[str, str], ...] = (
    (_DENSE, "CausalSelfAttentionKVCache"),
    (_PACKED, "QVGPackedCausalKVCache"),
)

#: The engine module of the base causal denoising stage (its class CausalDMDDenoisingStage).
STAGE_MODULE = "sglang.multimodal_gen.runtime.pipelines_core.stages.causal_denoising"
_STAGE_CLASS = "CausalDMDDenoisingStage"
_STAGE_METHODS = ("_supports_qvg_kv_cache_quantization", "_allocate_causal_kv_cache")
_PIP = "pip install sglang"


def _stage_quant_args(stage: Any, installed: Any) -> Any:
    """The K/V quantization settings of a stage's allocation: those given to
    :func:`install` when there are, else ``_kv_quant_args`` where the stage set it (the
    LingBot stage's realtime path), else its server args' ``kv_cache_quant_config``."""
    if installed is not None:
        return installed
    quant = getattr(stage, "_kv_quant_args", None)
    if quant is None:
        quant = getattr(getattr(stage, "server_args", None), "kv_cache_quant_config", None)
    return quant


def _supports_qvg_kv_cache_quantization(self: Any) -> bool:
    """qvg.sglang: every causal stage supports the packed cache."""
    return True


def _stage_allocation(engine_allocate: Any, installed: Any) -> Any:
    """The base stage's ``_allocate_causal_kv_cache`` while installed: the engine's
    (``engine_allocate``) for dense caches, qvg's packed caches when the settings
    (:func:`_stage_quant_args`) are enabled (module docstring)."""

    def _allocate_causal_kv_cache(self: Any, *, batch_size: int, kv_cache_size: int, num_attention_heads: int,
                                  attention_head_dim: int, dtype: Any, device: Any, use_int_indices: bool = False,
                                  sink_tokens: int = 0, global_sink_tokens: int = 0,
                                  attention_window_size: int | None = None, allow_growth: bool = False) -> list:
        """qvg.sglang: the engine's dense allocation, or packed caches when the stage's
        quantization settings are enabled (module docstring)."""
        quant = _stage_quant_args(self, installed)
        if quant is None or not getattr(quant, "enabled", False):
            return engine_allocate(
                self, batch_size=batch_size, kv_cache_size=kv_cache_size, num_attention_heads=num_attention_heads,
                attention_head_dim=attention_head_dim, dtype=dtype, device=device, use_int_indices=use_int_indices,
                sink_tokens=sink_tokens, global_sink_tokens=global_sink_tokens,
                attention_window_size=attention_window_size, allow_growth=allow_growth)
        if global_sink_tokens or allow_growth:
            raise NotImplementedError(
                f"{type(self).__name__}: qvg's packed K/V cache does not support the pinned multi-shot sink "
                f"(global_sink_tokens={global_sink_tokens}) or allow_growth={allow_growth}; turn K/V quantization "
                "off (kv_cache_quant_config) or the multi-shot sink off for this request")
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

    return _allocate_causal_kv_cache


def _packed_class(installed: Any) -> type:
    """qvg's packed cache class, or with settings given to :func:`install` a subclass
    building every cache with them (whatever settings the engine passes)."""
    if installed is None:
        return _qt.QVGPackedCausalKVCache

    def __init__(self: Any, **kwargs: Any) -> None:
        kwargs["quant_args"] = installed
        _qt.QVGPackedCausalKVCache.__init__(self, **kwargs)

    return type("QVGPackedCausalKVCache", (_qt.QVGPackedCausalKVCache,),
                {"__init__": __init__, "__module__": __name__, "__doc__": _qt.QVGPackedCausalKVCache.__doc__})


def _find_stage() -> list[_dropin.Attribute]:
    """The base stage's two methods (none when its module does not import: the engine
    without its serving dependencies); EngineNameError when the module imports but
    lacks the class or the class does not define both methods itself."""
    try:
        module = _dropin.engine_module(__name__, STAGE_MODULE, _PIP)
    except _dropin.EngineNameError:
        return []
    cls = _dropin.engine_attr(__name__, module, _STAGE_CLASS)
    for name in _STAGE_METHODS:
        _dropin.engine_attr(__name__, cls, name, own=True)
    return [_dropin.Attribute(cls, name) for name in _STAGE_METHODS]


def _find() -> _dropin.Found:
    if _STAGE_ONLY.is_installed():  # its methods would be taken as the engine's originals
        raise RuntimeError("qvg.sglang: the stage-only patch (_patch_stage) is installed; "
                           "_unpatch_stage() before install()")
    stage = _find_stage()  # imports the stage module first, so that the rebinding reaches it
    originals = [_dropin.engine_attr(__name__, _dropin.engine_module(__name__, module, _PIP), name)
                 for module, name in ENGINE_MODULES]
    return _dropin.Found([*stage, *(_dropin.Rebind("sglang", cls) for cls in originals)])


def _stage_substitutes(installed: Any, stage: list[_dropin.Attribute]) -> list[Any]:
    return [_supports_qvg_kv_cache_quantization, _stage_allocation(stage[1].original, installed)] if stage else []


def _substitutes(installed: Any, found: _dropin.Found) -> list[Any]:
    stage = [b for b in found.bindings if isinstance(b, _dropin.Attribute)]
    return [*_stage_substitutes(installed, stage), _qt.CausalSelfAttentionKVCache, _packed_class(installed)]


_DROPIN = _dropin.DropIn(__name__, _find, _substitutes)

# The stage's methods alone, the cache classes left the engine's (the end-to-end suite
# runs the engine's own packed cache through the base stage this way).
_STAGE_ONLY = _dropin.DropIn(__name__, lambda: _dropin.Found(_find_stage()),
                             lambda installed, found: _stage_substitutes(installed, list(found.bindings)))


def _patch_stage() -> bool:
    """Only the base stage's two methods (tests); False when its module does not import.
    While install() holds them the stage is already patched: a second DropIn over the
    same methods would take install()'s as the originals, so nothing is done then."""
    if _DROPIN.is_installed():
        return stage_patched()
    _STAGE_ONLY.install()
    return bool(_STAGE_ONLY.found and _STAGE_ONLY.found.bindings)


def _unpatch_stage() -> None:
    _STAGE_ONLY.uninstall()


def stage_patched() -> bool:
    """True while the base causal stage's methods are qvg.sglang's (installed, and the
    engine's stage module imported)."""
    found = _DROPIN.found
    return bool(found and any(isinstance(b, _dropin.Attribute) for b in found.bindings))


def is_installed() -> bool:
    """True between :func:`install` and :func:`uninstall`."""
    return _DROPIN.is_installed()


def install(quant_args: Any = None) -> None:
    """Makes the engine allocate qvg's caches: rebinds ``CausalSelfAttentionKVCache``
    and ``QVGPackedCausalKVCache`` to :mod:`qvg.torch`'s in the engine's modules, and
    lets the base causal stage allocate the packed cache (module docstring).
    ``quant_args``: None (the default) leaves the settings to the engine (each
    request's ``kv_cache_quant_config``); settings (anything
    :func:`qvg.torch.as_quant_args` takes, validated first) replace the engine's in the
    base stage's choice and in every packed cache the stages build. The contract of
    :mod:`qvg.dropin`: all-or-nothing (:class:`qvg.dropin.EngineNameError`, an
    ImportError, naming what the engine lacks; nothing changed), idempotent (other
    settings replace the installed ones), thread-safe. A stage module that cannot be
    imported only leaves the stage as it is (:func:`stage_patched` is False)."""
    _DROPIN.install(quant_args)


def uninstall() -> None:
    """Restores the engine's classes in every ``sglang.*`` module that holds qvg's
    (also modules imported while installed) and the stage's methods. A no-op when not
    installed."""
    _DROPIN.uninstall()


def installed(quant_args: Any = None) -> contextlib.AbstractContextManager[None]:
    """Context manager: :func:`install` on entry; on exit, also when the block raises,
    what was installed at entry is back (nothing, or the settings then installed:
    blocks nest; :mod:`qvg.dropin`)."""
    return _DROPIN.installed(quant_args)
