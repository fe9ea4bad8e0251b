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

The engine's ``QVGKVQuantArgs`` is left alone: qvg's packed cache takes the engine's
settings object as is (missing qvg extensions take their defaults). The differences
in behaviour from the engine's caches are listed in docs/compat.md.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Iterator
from typing import Any

from . import torch as _qt

__all__ = ["install", "uninstall", "installed", "is_installed", "ENGINE_MODULES"]

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


def _swap_union(value: types.UnionType, mapping: dict[Any, Any]) -> Any:
    """The union with its members mapped (others kept), or the value itself if none is."""
    args = value.__args__
    if not any(a in mapping for a in args):
        return value
    new = [mapping.get(a, a) for a in args]
    out = new[0]
    for a in new[1:]:
        out = out | a
    return out


def _rebind(mapping: dict[Any, Any]) -> int:
    """In every imported ``sglang.*`` module, rebinds each global that is (by identity)
    a key of ``mapping`` to its value, and rebuilds type unions holding one. Returns the
    number of rebound names."""
    count = 0
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "sglang" or module_name.startswith("sglang.")):
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key, value in list(namespace.items()):
            try:
                hit = value in mapping
            except Exception:  # noqa: BLE001 - unhashable or odd __eq__: not one of ours
                hit = False
            if hit:
                namespace[key] = mapping[value]
                count += 1
            elif isinstance(value, types.UnionType):
                new = _swap_union(value, mapping)
                if new is not value:
                    namespace[key] = new
                    count += 1
    return count


def is_installed() -> bool:
    """True between :func:`install` and :func:`uninstall`."""
    return bool(_originals)


def install() -> None:
    """Makes the engine allocate qvg's caches: rebinds ``CausalSelfAttentionKVCache``
    and ``QVGPackedCausalKVCache`` to :mod:`qvg.torch`'s in the engine's modules (see
    the module docstring). Idempotent. Raises ImportError when the engine's cache
    modules cannot be imported."""
    if _originals:
        return
    originals = _engine_originals()
    _originals.update(originals)
    _rebind({originals[name]: _SUBSTITUTES[name] for name in originals})


def uninstall() -> None:
    """Restores the engine's classes in every ``sglang.*`` module that holds qvg's
    (also modules imported while installed). A no-op when not installed."""
    if not _originals:
        return
    _rebind({_SUBSTITUTES[name]: cls for name, cls in _originals.items()})
    _originals.clear()


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
