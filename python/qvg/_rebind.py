"""Rebinding an engine's module globals: how the drop-ins (qvg.sglang, qvg.flashdreams)
swap the engine's cache classes for qvg's in modules that imported them by name."""

from __future__ import annotations

import sys
import types
from typing import Any


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


def rebind(package: str, mapping: dict[Any, Any]) -> int:
    """In every imported module of ``package`` (the package and ``package.*``), rebinds
    each global that is (by identity) a key of ``mapping`` to its value, and rebuilds
    type unions holding one. Returns the number of rebound names."""
    count = 0
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == package or module_name.startswith(package + ".")):
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
