"""qvg.dropin — the contract every engine drop-in keeps (qvg.sglang, qvg.flashdreams,
qvg.vllm_omni), in one place; docs/engines.md, "Writing a drop-in", says how to write
one on it.

A drop-in makes an engine run on qvg's caches by replacing some of the engine's
names: classes rebound (by identity) in every module of the engine's package that
holds them (:class:`Rebind`), and attributes of a module or class (:class:`Attribute`).
:class:`DropIn` holds what is installed and gives each drop-in its ``install``,
``uninstall``, ``installed`` and ``is_installed``, with one contract:

* **One way to pass settings**: ``install(quant_args=None)`` / ``installed(quant_args=None)``,
  read by :func:`qvg.torch.as_quant_args` (None; a QVGKVQuantArgs; the engine's
  settings object; a dict of the engine's flat ``kv_cache_quant*`` flags) and
  validated before anything changes (ValueError).
* **All-or-nothing**: every engine name is looked up before anything changes; one
  that is missing raises :class:`EngineNameError` (an ImportError) naming it, and
  the engine is left as it was. A change that fails midway puts back every name
  already changed before the error propagates (installing new settings over old
  ones: the old ones stay installed).
* **Idempotent**: installing the settings already installed changes nothing;
  other settings replace them (``uninstall()`` then restores the engine, not the
  previous settings).
* **Thread-safe**: install, uninstall and ``installed()``'s entry and exit take the
  drop-in's lock; two threads installing at once install once.
* **Nestable**: ``installed()`` restores on exit exactly what was in place at its
  entry (not installed, or installed with the settings in place then), also when the
  block raises. Blocks of several threads may overlap: a block that exits while a
  block entered after it is still open hands its entry state to that block, so
  qvg stays installed until the last open block exits.
* ``uninstall()`` restores every name the drop-in replaced, whatever installs
  preceded (modules imported while installed included); a no-op when not installed.

The state is process-wide, as the engine's names are: caches an engine builds while
one thread's settings are installed have those settings, whichever thread asked.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from . import torch as _qt
from ._rebind import rebind

__all__ = ["EngineNameError", "Rebind", "Attribute", "Found", "DropIn", "engine_module", "engine_attr"]


class EngineNameError(ImportError):
    """A drop-in could not find a name of its engine (a module that does not import,
    a class or attribute that is not there): the engine's version differs from the
    one the drop-in was written for, or the engine is not installed. ``name`` is the
    dotted engine name, ``dropin`` the drop-in's module. Raised before anything
    changed: the engine is as it was."""

    def __init__(self, dropin: str, name: str, reason: str) -> None:
        super().__init__(f"{dropin} could not find the engine's {name}: {reason} (nothing was changed)", name=name)
        self.dropin = dropin


def engine_module(dropin: str, module: str, hint: str) -> ModuleType:
    """The engine's module ``module``, imported; EngineNameError naming it (with
    ``hint``, e.g. "pip install sglang") when it does not import."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise EngineNameError(dropin, module, f"{dropin} needs it ({hint}); importing it failed: {e}") from e


def engine_attr(dropin: str, owner: Any, name: str, *, own: bool = False) -> Any:
    """``owner.name``; with ``own``, defined by ``owner`` itself (its ``__dict__``),
    not inherited: a drop-in replacing a method must find it where it replaces it.
    EngineNameError naming ``owner.name`` otherwise."""
    where = f"{getattr(owner, '__module__', '') + '.' if isinstance(owner, type) else ''}" \
            f"{getattr(owner, '__qualname__', getattr(owner, '__name__', repr(owner)))}.{name}"
    space = getattr(owner, "__dict__", {})
    if own and name not in space:
        raise EngineNameError(dropin, where, "it is not defined there" +
                              (" (it is inherited)" if hasattr(owner, name) else ""))
    if not hasattr(owner, name):
        raise EngineNameError(dropin, where, "it does not exist")
    return space[name] if own else getattr(owner, name)


class Rebind:
    """An engine object (a class) rebound by identity in every imported module of
    ``package`` that holds it (and in type unions holding it), so that modules
    imported later, which import it from those modules, get the substitute too."""

    def __init__(self, package: str, original: Any) -> None:
        self.package, self.original = package, original

    def swap(self, old: Any, new: Any) -> bool:
        rebind(self.package, {old: new})
        return True


class Attribute:
    """An attribute of a module or class (a module global, a method the owner
    defines itself), replaced in place."""

    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name = owner, name
        self.original = owner.__dict__[name]

    def swap(self, old: Any, new: Any) -> bool:
        """Sets the substitute where ``old`` is still bound; False (nothing changed)
        when something else replaced it meanwhile."""
        if self.owner.__dict__.get(self.name) is not old:
            return False
        setattr(self.owner, self.name, new)
        return True


@dataclass
class Found:
    """What a drop-in's ``find`` looked up: the replaced names (``bindings``, each with
    its ``original``) and other engine objects its substitutes use (``names``)."""

    bindings: Sequence[Rebind | Attribute]
    names: dict[str, Any] = field(default_factory=dict)


_OFF = object()  # the state "not installed"


@dataclass(eq=False)
class _Frame:
    entry: Any  # the state at the block's entry: _OFF, or (settings, the values then bound)


class DropIn:
    """One engine drop-in's installed state and its contract (module docstring).

    ``find()``: looks up every engine name (imports included) and returns a
    :class:`Found`; raises EngineNameError, changing nothing. Called when not
    installed (while installed the engine's names are the drop-in's).
    ``substitutes(settings, found)``: the values to bind, one per binding, for these
    settings (None or a validated QVGKVQuantArgs); must not change anything.
    ``result(bound)``: what ``install`` returns and ``installed`` yields (default None).
    """

    def __init__(self, name: str, find: Callable[[], Found], substitutes: Callable[[Any, Found], Sequence[Any]],
                 result: Callable[[Sequence[Any]], Any] | None = None) -> None:
        self.name = name
        self._find, self._substitutes, self._result = find, substitutes, result or (lambda bound: None)
        self._lock = threading.RLock()
        self._found: Found | None = None  # while installed
        self._bound: list[Any] = []  # the values bound now, one per binding
        self._settings: Any = _OFF
        self._frames: list[_Frame] = []

    # -- state ----------------------------------------------------------------------
    def is_installed(self) -> bool:
        """True between install and uninstall."""
        return self._found is not None

    @property
    def settings(self) -> Any:
        """The settings installed (None or a QVGKVQuantArgs); None also when not
        installed (see :meth:`is_installed`)."""
        return None if self._settings is _OFF else self._settings

    @property
    def found(self) -> Found | None:
        """The engine names found by the install in place (None when not installed)."""
        return self._found

    def _state(self) -> Any:
        """``_OFF``, or (settings, the values bound): what a block restores."""
        return _OFF if self._found is None else (self._settings, list(self._bound))

    def _set(self, settings: Any, bound: Sequence[Any] | None = None) -> Any:
        """Installs ``settings`` (``_OFF``: uninstalls), all-or-nothing; ``bound``: the
        values to bind (a state restored by a block), else the substitutes for them."""
        if settings is _OFF:
            self._remove()
            return None
        if self._found is not None and self._settings == settings and (bound is None or list(bound) == self._bound):
            return self._result(self._bound)
        found = self._found if self._found is not None else self._find()
        new = list(self._substitutes(settings, found) if bound is None else bound)
        old = self._bound if self._found is not None else [b.original for b in found.bindings]
        done: list[tuple[Any, Any, Any]] = []
        try:
            for b, o, n in zip(found.bindings, old, new, strict=True):
                if not b.swap(o, n):
                    raise RuntimeError(f"{self.name}: the engine's {getattr(b, 'name', b)} was replaced by someone "
                                       "else while qvg was installing (nothing was changed)")
                done.append((b, o, n))
        except BaseException:
            for b, o, n in reversed(done):
                b.swap(n, o)
            raise
        self._found, self._bound, self._settings = found, new, settings
        return self._result(new)

    def _remove(self) -> None:
        if self._found is None:
            return
        for b, o, n in reversed(list(zip(self._found.bindings, [b.original for b in self._found.bindings],
                                         self._bound))):
            b.swap(n, o)
        self._found, self._bound, self._settings = None, [], _OFF

    # -- the API each drop-in exposes ------------------------------------------------------
    def install(self, quant_args: Any = None) -> Any:
        """Installs with ``quant_args`` (module docstring: all-or-nothing, idempotent,
        thread-safe); returns ``result(bound)``."""
        settings = _qt.as_quant_args(quant_args)
        with self._lock:
            return self._set(settings)

    def uninstall(self) -> None:
        """Restores every engine name; a no-op when not installed."""
        with self._lock:
            self._remove()

    @contextlib.contextmanager
    def installed(self, quant_args: Any = None) -> Iterator[Any]:
        """Installs on entry (yields what install returns); on exit restores the state
        at entry (module docstring: nesting and overlapping threads)."""
        settings = _qt.as_quant_args(quant_args)
        with self._lock:
            frame = _Frame(self._state())
            out = self._set(settings)
            self._frames.append(frame)
        try:
            yield out
        finally:
            with self._lock:
                i = next(j for j, f in enumerate(self._frames) if f is frame)
                del self._frames[i]
                if i < len(self._frames):  # a block entered later is still open: it restores for both
                    self._frames[i].entry = frame.entry
                elif frame.entry is _OFF:
                    self._remove()
                else:
                    self._set(*frame.entry)
