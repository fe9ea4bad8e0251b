"""qvg.flashdreams — qvg's caches behind NVIDIA flashdreams' ``BlockKVCache``.

flashdreams (0.1.0, PyPI) keeps every self-attention K/V cache of its runners
(Self-Forcing, Causal-Forcing, LingBot-fast, HY-WorldPlay: the Wan, Cosmos and template
recipes) in one pure-torch class, ``flashdreams.core.attention.kvcache.BlockKVCache``.
:class:`BlockKVCache` here has the same constructor, methods, properties and layouts
(any ``k_shape`` with the sequence at ``seq_dim``), backed by qvg's caches:

* dense (``quant_args=None``, the default): qvg's dense cache
  (:class:`qvg.torch.CausalSelfAttentionKVCache`) writes into buffers of ``k_shape`` /
  ``v_shape``; ``cached_k()`` / ``cached_v()`` are views of them, bit for bit what
  flashdreams' class returns (same shape, strides and values);
* packed (``quant_args`` a :class:`qvg.torch.QVGKVQuantArgs`, or a dict of the
  engine's flat flags such as ``{"kv_cache_quant": "int2", "kv_cache_quant_profile":
  "hq"}``): qvg's packed cache (:class:`qvg.torch.QVGPackedCausalKVCache`, spec 4):
  completed chunks are PRQ-packed, ``cached_k()`` returns the same tokens in the same
  order and shape (decoded; bit for bit with ``bits=None``).

:func:`install` rebinds the name ``BlockKVCache`` to this class in every imported
``flashdreams.*`` module holding flashdreams' class (the ``kvcache`` module, the
``flashdreams.core.attention`` package, the recipes' ``modules.py`` / ``network.py``,
which import it from there), so modules imported afterwards get it too::

    import qvg.flashdreams
    qvg.flashdreams.install()                                  # dense
    qvg.flashdreams.install(quant_args={"kv_cache_quant": "int4"})   # packed
    ... build the runner with use_cuda_graph=False ...
    qvg.flashdreams.uninstall()

    with qvg.flashdreams.installed(quant_args={"kv_cache_quant": "int2"}):
        ...                       # on exit, what was installed before is back

install / uninstall / installed keep the contract of every qvg drop-in
(:mod:`qvg.dropin`): all-or-nothing, idempotent, thread-safe, nestable, settings
passed one way (``quant_args``).

Semantics (flashdreams' class, read from the 0.1.0 wheel; docs/engines.md): the cache
holds ``sink_size + window_size`` tokens; ``before_update(i)`` opens chunk ``i`` (the
next one, ``prev + 1``, or the last one again, ``prev``, as denoising steps do);
``update(k, v)`` writes its ``chunk_size`` tokens (any number of times per chunk);
``cached_k()`` / ``cached_v()`` return the tokens visible to it — the first ``sink_size``
tokens of the sequence and the newest ``window_size`` up to the chunk's end, in
global order; ``after_update(i)`` closes it. ``reset()`` empties the cache.

Differences from flashdreams' class (each one a refusal with a typed error, never a
silent change; docs/engines.md):

* CUDA graph capture is refused (NotImplementedError): qvg's storage moves between
  calls. flashdreams' runners default to ``use_cuda_graph=True``: set it False.
* ``cached_k()`` / ``cached_v()`` of a new chunk before its ``update()`` raise
  RuntimeError (flashdreams returns the rolled buffer whose last chunk is stale); of a
  repeated chunk before ``update()`` they return the visible tokens as cached. Closing
  a new chunk never written (``after_update`` without ``update``) is RuntimeError.
* Errors are typed (ValueError for bad arguments, RuntimeError for calls out of
  protocol order) where flashdreams asserts; a call that raises changes nothing.
* Keys and values must have the same last dimension, and ``window_size >=
  chunk_size`` (flashdreams then keeps only the chunk's tail): NotImplementedError.
* Non-finite key/value values are rejected (ValueError), as everywhere in qvg.
* Packed: no ``_k`` / ``_v`` buffers exist (the state is qvg's segments).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from . import dropin as _dropin
from . import torch as _qt

__all__ = ["BlockKVCache", "install", "uninstall", "installed", "is_installed", "ENGINE_MODULE"]

#: flashdreams' module defining the replaced class.
ENGINE_MODULE = "flashdreams.core.attention.kvcache"


_DEFAULT = object()  # quant_args not given: the class's (install(quant_args=...) sets it)


def _capturing() -> bool:
    """True while the current CUDA stream is being captured into a CUDA graph."""
    return bool(torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing())


def _int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


class BlockKVCache:
    """flashdreams' ``BlockKVCache`` over qvg's dense or packed cache (module docstring).

    ``k_shape`` / ``v_shape``: the buffers' shapes, equal (the sequence dimension
    ``seq_dim`` holds ``sink_size + window_size`` tokens, the last one is the head
    dimension); ``chunk_size`` divides ``sink_size + window_size``. ``device``, ``dtype``
    (float32, bfloat16, float16): as flashdreams'. ``quant_args`` (qvg only, keyword):
    None for the dense cache, else the packed cache's settings.

    Internally the dimensions before ``seq_dim`` are the batch and those between
    ``seq_dim`` and the last are the heads of qvg's ``[B, S, H, D]`` layout (a view of
    the same memory, no copy).
    """

    _default_quant_args: Any = None  # install(quant_args=...) makes a subclass with its own

    def __init__(
        self,
        k_shape: tuple[int, ...],
        v_shape: tuple[int, ...],
        seq_dim: int,
        chunk_size: int,
        window_size: int,
        sink_size: int = 0,
        device: torch.device | str = torch.device("cuda"),
        dtype: torch.dtype = torch.float16,
        *,
        quant_args: Any = _DEFAULT,
    ) -> None:
        k_shape, v_shape = tuple(k_shape), tuple(v_shape)
        for name, shape in (("k_shape", k_shape), ("v_shape", v_shape)):
            if len(shape) < 2 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
                raise ValueError(f"{name} must be a tuple of at least 2 positive integers, got {shape!r}")
        if k_shape[:-1] != v_shape[:-1]:
            raise ValueError(f"k_shape and v_shape must be equal except for the last dimension, got {k_shape} "
                             f"and {v_shape}")
        if k_shape[-1] != v_shape[-1]:
            raise NotImplementedError(f"qvg's caches keep keys and values of one head dimension: k_shape[-1] must "
                                      f"equal v_shape[-1], got {k_shape[-1]} and {v_shape[-1]}")
        ndim = len(k_shape)
        if isinstance(seq_dim, bool) or not isinstance(seq_dim, int) or not -ndim <= seq_dim < ndim:
            raise ValueError(f"seq_dim must be an integer in [-{ndim}, {ndim}), got {seq_dim!r}")
        seq_dim = seq_dim % ndim
        if seq_dim == ndim - 1:
            raise NotImplementedError(f"seq_dim must not be the last (head) dimension {ndim - 1} in qvg, got {seq_dim}")
        chunk_size = _int("chunk_size", chunk_size, 1)
        window_size = _int("window_size", window_size, 0)
        sink_size = _int("sink_size", sink_size, 0)
        total = sink_size + window_size
        if k_shape[seq_dim] != total:
            raise ValueError(f"k_shape[seq_dim] ({k_shape[seq_dim]}) must equal sink_size + window_size ({total})")
        if total % chunk_size:
            raise ValueError(f"sink_size + window_size ({total}) must be divisible by chunk_size ({chunk_size})")
        if window_size < chunk_size:
            raise NotImplementedError(
                f"window_size ({window_size}) < chunk_size ({chunk_size}): flashdreams then keeps only the last "
                "window_size tokens of each chunk, qvg always keeps the whole current chunk visible")
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dtype must be one of torch.float32, torch.bfloat16, torch.float16, got {dtype}")
        if quant_args is _DEFAULT:
            quant_args = type(self)._default_quant_args
        quant_args = _qt.as_quant_args(quant_args)

        self.k_shape, self.v_shape, self.seq_dim = k_shape, v_shape, seq_dim
        self.chunk_size, self.window_size, self.sink_size = chunk_size, window_size, sink_size
        self.device, self.dtype = device, dtype
        self.quant_args = quant_args
        batch = math.prod(k_shape[:seq_dim])
        heads = math.prod(k_shape[seq_dim + 1:-1])
        self._qvg_shape = (batch, total, heads, k_shape[-1])
        cursors = dict(global_end_index=torch.zeros(1, dtype=torch.long),
                       local_end_index=torch.zeros(1, dtype=torch.long))
        if quant_args is None:
            self._k = torch.empty(k_shape, device=device, dtype=dtype)
            self._v = torch.empty(v_shape, device=device, dtype=dtype)
            self._c = _qt.CausalSelfAttentionKVCache(self._k.view(self._qvg_shape), self._v.view(self._qvg_shape),
                                                     global_end_index_int=0, local_end_index_int=0,
                                                     sink_tokens=sink_size, **cursors)
        else:
            self._c = _qt.QVGPackedCausalKVCache(batch_size=batch, cache_size=total, num_heads=heads,
                                                 head_dim=k_shape[-1], dtype=dtype, device=device,
                                                 use_int_indices=True, sink_tokens=sink_size, quant_args=quant_args,
                                                 **cursors)
        self._prev_chunk_idx = -1  # flashdreams' bookkeeping, same names and meaning
        self._curr_chunk_idx: int | None = None
        self._n_cached = 0
        self._written = False  # update() called since before_update()
        self._view: tuple[torch.Tensor, torch.Tensor] | None = None  # packed: the last update's visible K/V

    @property
    def packed(self) -> bool:
        """True for the packed cache (``quant_args`` given)."""
        return self.quant_args is not None

    # -- flashdreams' read-only interface ---------------------------------------------
    @property
    def size(self) -> int:
        """Number of valid cached tokens visible to attention."""
        if self._curr_chunk_idx is None:
            return self._n_cached
        return self._visible_end()

    @property
    def write_end(self) -> int:
        """Right edge of the current chunk in the (logical) cache layout."""
        self._need_open("write_end")
        return self.size

    def _total(self) -> int:
        return self.sink_size + self.window_size

    def _kind(self, chunk_idx: int) -> str:
        """'new' (prev + 1) or 'same' (prev); ValueError otherwise."""
        if chunk_idx == self._prev_chunk_idx + 1:
            return "new"
        if chunk_idx == self._prev_chunk_idx:
            return "same"
        raise ValueError(f"chunk_idx must be {self._prev_chunk_idx + 1} (the next chunk) or {self._prev_chunk_idx} "
                         f"(the last one again), got {chunk_idx}")

    def _visible_end(self) -> int:
        if self._kind(self._curr_chunk_idx) == "new":
            return min(self._n_cached + self.chunk_size, self._total())
        return min(self._n_cached, self._total())

    def is_steady_state(self) -> bool:
        """True when the cache is full (each new chunk evicts the oldest window chunk)."""
        self._need_open("is_steady_state()")
        return self._steady()

    def _steady(self) -> bool:
        overlaps_sink = self.sink_size > 0 and self._curr_chunk_idx * self.chunk_size < self.sink_size
        return self._n_cached == self._total() and not overlaps_sink

    def _need_open(self, what: str) -> None:
        if self._curr_chunk_idx is None:
            raise RuntimeError(f"BlockKVCache.{what} needs an open chunk: call before_update(chunk_idx) first")

    @staticmethod
    def _refuse_capture(what: str) -> None:
        if _capturing():
            raise NotImplementedError(
                f"qvg.flashdreams.BlockKVCache.{what} was called during CUDA graph capture: qvg's cache storage is "
                "not at fixed addresses, so a captured graph would replay stale memory. Build the flashdreams runner "
                "with use_cuda_graph=False (or qvg.flashdreams.uninstall() for CUDA graphs without qvg).")

    # -- flashdreams' protocol --------------------------------------------------------
    def before_update(self, chunk_idx: int) -> None:
        """Opens chunk ``chunk_idx``: the next one (``prev + 1``) or the last one again."""
        chunk_idx = _int("chunk_idx", chunk_idx, 0)
        if self._curr_chunk_idx is not None:
            raise RuntimeError(f"BlockKVCache.before_update({chunk_idx}): chunk {self._curr_chunk_idx} is still open; "
                               "call after_update() first")
        self._kind(chunk_idx)
        self._curr_chunk_idx = chunk_idx
        self._written = False

    def update(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Writes the open chunk's keys and values (shape ``k_shape`` / ``v_shape`` with
        ``chunk_size`` at ``seq_dim``; cast to the cache's dtype and device as
        flashdreams' assignment does). May be called again for the same chunk."""
        self._refuse_capture("update()")
        self._need_open("update()")
        self._kind(self._curr_chunk_idx)  # next or same chunk (after reset() an open chunk > 0 is refused)
        for name, x, shape in (("k", k, self.k_shape), ("v", v, self.v_shape)):
            want = shape[:self.seq_dim] + (self.chunk_size,) + shape[self.seq_dim + 1:]
            if not isinstance(x, torch.Tensor) or tuple(x.shape) != want:
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{name} must be a tensor of shape {want} (chunk_size {self.chunk_size} at seq_dim "
                                 f"{self.seq_dim}), got {got}")
        b, _, h, d = self._qvg_shape
        key = k.to(device=self.device, dtype=self.dtype).reshape(b, self.chunk_size, h, d)
        value = v.to(device=self.device, dtype=self.dtype).reshape(b, self.chunk_size, h, d)
        # (the packed cache's last view stays held during the call, so that a failing call
        # changes nothing; qvg copies a zero-copy view that is still held: one chunk at most)
        out = self._c.update_and_get_attention_kv(key=key, value=value,
                                                  current_chunk_start=self._curr_chunk_idx * self.chunk_size)
        if self.packed:
            self._view = (self._to_layout(out.k), self._to_layout(out.v))
        self._written = True

    def _to_layout(self, x: torch.Tensor) -> torch.Tensor:
        """qvg's ``[B, T, H, D]`` -> flashdreams' layout with T at seq_dim."""
        s = self.k_shape
        return x.reshape(s[:self.seq_dim] + (x.shape[1],) + s[self.seq_dim + 1:-1] + (x.shape[3],))

    def after_update(self, chunk_idx: int) -> None:
        """Closes the open chunk (``chunk_idx`` must be the one opened)."""
        self._need_open(f"after_update({chunk_idx!r})")
        if chunk_idx != self._curr_chunk_idx:
            raise ValueError(f"chunk_idx must be the open chunk {self._curr_chunk_idx}, got {chunk_idx!r}")
        if self._kind(chunk_idx) == "new" and not self._written:
            raise RuntimeError(f"BlockKVCache.after_update({chunk_idx}): the new chunk was never written (call "
                               "update(k, v) first); flashdreams would count its stale buffer tokens as cached")
        if self._kind(chunk_idx) == "new":
            if not self._steady():
                self._n_cached += self.chunk_size
            self._prev_chunk_idx += 1
        self._curr_chunk_idx = None

    def _cached(self, which: int, what: str) -> torch.Tensor:
        self._refuse_capture(what)
        self._need_open(what)
        if not self._written and self._kind(self._curr_chunk_idx) == "new":
            raise RuntimeError(f"BlockKVCache.{what} of the new chunk {self._curr_chunk_idx} before update(): its "
                               "tokens are not in the cache yet")
        if not self.packed:
            buf = self._k if which == 0 else self._v
            idx = [slice(None)] * len(self.k_shape)
            idx[self.seq_dim] = slice(0, self._visible_end())
            return buf[tuple(idx)]
        if self._view is None:  # the last chunk again, never updated since reset
            raise RuntimeError(f"BlockKVCache.{what}: nothing is cached yet (call update() first)")
        return self._view[which]

    def cached_k(self) -> torch.Tensor:
        """Keys visible to the open chunk: ``[..., T, ..., D]`` with T = :attr:`size` at
        ``seq_dim`` (dense: a view of the buffer; packed: decoded tokens)."""
        return self._cached(0, "cached_k()")

    def cached_v(self) -> torch.Tensor:
        """Values visible to the open chunk (as :meth:`cached_k`)."""
        return self._cached(1, "cached_v()")

    def reset(self) -> None:
        """Empties the cache (flashdreams: the open chunk, if any, stays open)."""
        self._c.reset_indices()
        self._prev_chunk_idx = -1
        self._n_cached = 0
        self._view = None
        self._written = False

    # -- qvg's additions ----------------------------------------------------------------
    def resident_nbytes(self) -> int:
        """Bytes of the cache state (dense: both buffers; packed: raw and encoded segments)."""
        return self._c.resident_nbytes()

    @classmethod
    def from_tensor(cls, k: torch.Tensor, v: torch.Tensor, seq_dim: int) -> BlockKVCache:
        """A single-chunk cache holding ``k`` / ``v`` (flashdreams' cross-attention
        context caches): always dense, whatever :func:`install` was given."""
        n = k.shape[seq_dim]
        cache = cls(k_shape=tuple(k.shape), v_shape=tuple(v.shape), seq_dim=seq_dim, chunk_size=n, window_size=n,
                    device=k.device, dtype=k.dtype, quant_args=None)
        cache.before_update(0)
        cache.update(k, v)
        cache.after_update(0)
        cache._curr_chunk_idx = 0
        return cache

    def __repr__(self) -> str:
        mode = f"packed {self.quant_args.describe() if hasattr(self.quant_args, 'describe') else self.quant_args}" \
            if self.packed else "dense"
        return (f"qvg.flashdreams.BlockKVCache(k_shape={self.k_shape}, seq_dim={self.seq_dim}, chunk_size="
                f"{self.chunk_size}, window_size={self.window_size}, sink_size={self.sink_size}, {mode})")


# ---------------------------------------------------------------------------
# install / uninstall (the drop-in contract: qvg.dropin, docs/engines.md)
# ---------------------------------------------------------------------------


def _find() -> _dropin.Found:
    module = _dropin.engine_module(__name__, ENGINE_MODULE, "pip install flashdreams")
    _dropin.engine_module(__name__, "flashdreams.core.attention", "pip install flashdreams")
    original = _dropin.engine_attr(__name__, module, "BlockKVCache")
    return _dropin.Found([_dropin.Rebind("flashdreams", original)])


def _substitutes(quant_args: Any, found: _dropin.Found) -> list[type]:
    if quant_args is None:
        return [BlockKVCache]
    return [type("BlockKVCache", (BlockKVCache,), {"_default_quant_args": quant_args, "__module__": __name__,
                                                   "__doc__": BlockKVCache.__doc__})]


_DROPIN = _dropin.DropIn(__name__, _find, _substitutes, result=lambda bound: bound[0])


def is_installed() -> bool:
    """True between :func:`install` and :func:`uninstall`."""
    return _DROPIN.is_installed()


def install(quant_args: Any = None) -> type:
    """Makes flashdreams build qvg caches: rebinds ``BlockKVCache`` in every imported
    ``flashdreams.*`` module (and in its defining module and package, for modules
    imported later) to :class:`BlockKVCache` — dense with ``quant_args=None``, else a
    subclass whose caches are packed with these settings (anything
    :func:`qvg.torch.as_quant_args` takes: a QVGKVQuantArgs, the engine's settings or a
    dict of the engine's flags; validated first). Returns the class bound. The
    contract of :mod:`qvg.dropin`: all-or-nothing (:class:`qvg.dropin.EngineNameError`,
    an ImportError, naming what flashdreams lacks; nothing changed), idempotent (other
    settings replace the installed ones), thread-safe."""
    return _DROPIN.install(quant_args)


def uninstall() -> None:
    """Puts flashdreams' class back in every ``flashdreams.*`` module holding qvg's
    (also modules imported while installed). A no-op when not installed."""
    _DROPIN.uninstall()


def installed(quant_args: Any = None) -> contextlib.AbstractContextManager[type]:
    """Context manager: :func:`install` on entry (yields the bound class); on exit,
    also when the block raises, what was installed at entry is back (nothing, or the
    settings then installed: blocks nest; :mod:`qvg.dropin`)."""
    return _DROPIN.installed(quant_args)
