"""qvg.vllm_omni — qvg's caches behind vLLM-Omni's LingBot-World request-path K/V cache.

vLLM-Omni (0.30.0) runs LingBot-World's direct (request) path with one
``LingBotAttentionCache(key, value, end, absolute_end, last_start, sink_end)`` per
transformer layer, allocated by ``allocate_lingbot_cache`` and updated by
``LingBotSelfAttention._update_cache(cache, key, value, current_start, *, sink_tokens,
update_cache) -> (visible_key, visible_value)``, all in
``vllm_omni.diffusion.models.lingbot_world.transformer``. :func:`install` makes that
path run on qvg's caches:

* ``allocate_lingbot_cache`` (module global, called by the model's ``allocate_cache``)
  builds a :class:`LingBotQVGCache` per layer instead: dense (``quant_args=None``, over
  ``key`` / ``value`` buffers of the engine's shape ``[B, max_tokens, H, D]``, which
  after every committing call hold exactly the engine's bytes) or packed (qvg's packed
  cache, spec 4; no ``key`` / ``value`` buffers);
* ``LingBotSelfAttention._update_cache`` serves a :class:`LingBotQVGCache` with qvg
  and passes any other cache (the engine's own, the realtime path's paged inputs
  never reach it) to the engine's method.

::

    import qvg.vllm_omni
    qvg.vllm_omni.install()                                         # dense
    qvg.vllm_omni.install(quant_args={"kv_cache_quant": "int4"})    # packed
    qvg.vllm_omni.uninstall()

install / uninstall / installed keep the contract of every qvg drop-in
(:mod:`qvg.dropin`): all-or-nothing, idempotent, thread-safe, nestable, settings
passed one way (``quant_args``).

The engine's rules are kept: every argument check of ``_update_cache`` is made first,
with the engine's messages (ValueError); the returned views hold the engine's tokens
in the engine's order (dense and packed without quantization: bit for bit; the
cursors ``end``, ``absolute_end``, ``last_start``, ``sink_end`` move as the engine's).
LingBot's DMD loop calls a block's denoising probes with ``update_cache=False``
(history plus the noisy chunk, nothing stored) and then commits the clean chunk with
``update_cache=True`` at the same start: qvg writes the first probe as the next chunk
and every later call at that start as a rewrite of it, so nothing is copied and the
views are the engine's.

Differences (typed refusals, never a silent change; docs/engines.md):

* After a probe (``update_cache=False``) at a new start, the next call must be at that
  start with the same chunk size (NotImplementedError otherwise: qvg cannot take the
  probe back). Until the commit, the dense ``key`` / ``value`` buffers hold the probe.
* Packed: a probe that repeats the last committed start (``update_cache=False``) is
  refused (NotImplementedError); LingBot's flow never makes one.
* ``sink_tokens`` is fixed by the first call (NotImplementedError if it changes).
* Views of the dense cache alias its buffers (the engine returns new tensors): use
  them before the next call on the cache. Non-finite values are rejected (ValueError),
  also by a dense probe repeating the last committed start, which is checked as a
  write would be (shapes, dtype, device, values) though nothing is written.
* The realtime AR-diffusion engine (paged, ``experimental/ar_diffusion/kv_cache``) is
  not served: docs/engines.md says what it would need.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from . import dropin as _dropin
from . import torch as _qt

__all__ = ["LingBotQVGCache", "install", "uninstall", "installed", "is_installed", "ENGINE_MODULE"]

#: vLLM-Omni's module holding the replaced names.
ENGINE_MODULE = "vllm_omni.diffusion.models.lingbot_world.transformer"


class LingBotQVGCache:
    """One layer's LingBot self-attention K/V on a qvg cache, with the engine's
    ``LingBotAttentionCache`` fields (``end``, ``absolute_end``, ``last_start``,
    ``sink_end``; dense also ``key`` / ``value``). Used through the engine's
    ``_update_cache`` once :func:`install` ran, or :meth:`update` directly."""

    def __init__(self, *, batch_size: int, max_tokens: int, num_local_heads: int, head_dim: int,
                 device: torch.device | str, dtype: torch.dtype, quant_args: Any = None) -> None:
        for name, x in (("batch_size", batch_size), ("max_tokens", max_tokens), ("num_local_heads", num_local_heads),
                        ("head_dim", head_dim)):
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise ValueError(f"{name} must be a positive integer, got {x!r}")
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dtype must be one of torch.float32, torch.bfloat16, torch.float16, got {dtype}")
        self.quant_args = _qt.as_quant_args(quant_args)
        self.shape = (batch_size, max_tokens, num_local_heads, head_dim)
        self.device, self.dtype = torch.device(device), dtype
        if self.quant_args is None:  # the engine allocates zeros
            self.key: torch.Tensor | None = torch.zeros(self.shape, device=device, dtype=dtype)
            self.value: torch.Tensor | None = torch.zeros(self.shape, device=device, dtype=dtype)
        else:
            self.key = self.value = None
        # the engine's cursors (LingBotAttentionCache), moved by committing calls only
        self.end = 0
        self.absolute_end = 0
        self.last_start: int | None = None
        self.sink_end = 0
        self._c: Any = None  # the qvg cache, built by the first call (sink_tokens and origin known)
        self._origin = 0  # qvg position = engine position - origin
        self._sink_tokens: int | None = None
        self._pending: tuple[int, int] | None = None  # (start, tokens) of an uncommitted probe in the qvg cache

    @property
    def packed(self) -> bool:
        return self.quant_args is not None

    @property
    def capacity(self) -> int:
        return self.shape[1]

    def resident_nbytes(self) -> int:
        """Bytes of the cache state (dense: both buffers; packed: qvg's segments)."""
        if self._c is None:
            return 0 if self.packed else 2 * self.key.nbytes
        return self._c.resident_nbytes()

    def fork(self) -> LingBotQVGCache:
        """(qvg extension; the engine's cache has none) A branch of this layer's cache: a
        new ``LingBotQVGCache`` with the same cursors and settings whose next calls return
        what this cache would return, bit for bit, while this cache goes on its own way —
        one opening scene, two action sequences. Packed: the encoded history is shared
        (:meth:`qvg.torch.QVGPackedCausalKVCache.fork`), only the raw chunks are copied;
        dense: the buffers are copied. Fork every layer's cache at the same point (a
        model's :class:`LingBotTransformerCache` holds them in ``self_attention``).
        NotImplementedError while an uncommitted probe (``update_cache=False``) is in
        the cache: fork after the step that commits it."""
        if self._pending is not None:
            raise NotImplementedError(
                f"an uncommitted probe (update_cache=False) of {self._pending[1]} tokens at {self._pending[0]} is in "
                "the qvg cache: fork after the call that commits it")
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        if self._c is not None:
            new._c = self._c.fork()
            if not self.packed:
                new.key, new.value = new._c.k, new._c.v  # the dense fork's own buffers
        elif not self.packed:
            new.key, new.value = self.key.clone(), self.value.clone()
        return new

    def _check(self, n: int, current_start: int, sink_tokens: int) -> tuple[str, int]:
        """The engine's checks of ``_update_cache`` (its messages), on the committed
        cursors. Returns the kind of call ('first', 'repeat', 'advance') and the next
        sink_end."""
        capacity = self.capacity
        if self.last_start is None:
            if n > capacity:
                raise ValueError(
                    f"Current chunk has {n} tokens but the cache can hold only {capacity}; "
                    "the full current chunk must remain visible."
                )
            return "first", max(0, min(n, sink_tokens - current_start))
        if current_start == self.last_start:
            if current_start + n != self.absolute_end:
                raise ValueError("A repeated current_start must overwrite the same-size current chunk.")
            if n > self.end:
                raise ValueError("The current chunk is no longer fully retained in the cache.")
            return "repeat", self.sink_end
        if current_start < self.last_start:
            raise ValueError(f"current_start={current_start} precedes the latest chunk start {self.last_start}.")
        if current_start < self.absolute_end:
            raise ValueError(f"current_start={current_start} overlaps cached tokens ending at {self.absolute_end}.")
        if current_start > self.absolute_end:
            raise ValueError(
                f"New chunks must be contiguous: current_start={current_start}, expected {self.absolute_end}."
            )
        incoming = max(0, min(n, sink_tokens - current_start))
        next_sink_end = self.sink_end + incoming
        if n - incoming > capacity - next_sink_end:
            raise ValueError("The configured cache cannot retain all sink tokens and the full current chunk.")
        return "advance", next_sink_end

    def _build(self, current_start: int, sink_tokens: int) -> None:
        b, cap, h, d = self.shape
        sink = min(cap, max(0, sink_tokens - current_start))
        cursors = dict(global_end_index=torch.zeros(1, dtype=torch.long),
                       local_end_index=torch.zeros(1, dtype=torch.long))
        if self.packed:
            self._c = _qt.QVGPackedCausalKVCache(batch_size=b, cache_size=cap, num_heads=h, head_dim=d,
                                                 dtype=self.dtype, device=self.device, use_int_indices=True,
                                                 sink_tokens=sink, quant_args=self.quant_args, **cursors)
        else:
            self._c = _qt.CausalSelfAttentionKVCache(self.key, self.value, global_end_index_int=0,
                                                     local_end_index_int=0, sink_tokens=sink, **cursors)
        self._origin = current_start

    def _check_chunk(self, key: torch.Tensor, value: Any) -> None:
        """What qvg's caches check of a chunk (spec 5), for the dense repeat probe, which
        reads it without a cache call: key and value tensors of one shape ``[B, n, H, D]``
        with the cache's batch, heads and head_dim, dtype and device; every value finite
        with ``|x| <= 1e16``. ValueError naming the argument otherwise."""
        b, _, h, d = self.shape
        for name, x in (("key", key), ("value", value)):
            if not isinstance(x, torch.Tensor):
                raise ValueError(f"{name} must be a tensor [B, n, H, D], got {type(x).__name__}")
            if x.dim() != 4 or (x.shape[0], x.shape[2], x.shape[3]) != (b, h, d) or x.shape != key.shape:
                raise ValueError(f"{name} must have shape [{b}, n, {h}, {d}] (the cache's batch, heads and head_dim; "
                                 f"value the shape of key {list(key.shape)}), got {list(x.shape)}")
            if x.dtype != self.dtype:
                raise ValueError(f"{name} dtype must be the cache dtype {self.dtype}, got {x.dtype}")
            if x.device.type != self.device.type or self.device.index not in (None, x.device.index):
                raise ValueError(f"{name} must be on the cache's device {self.device}, got {x.device}")
            bad = ~(x.double().abs() <= 1e16)  # NaN compares False
            if bool(bad.any()):
                at = [int(i) for i in bad.nonzero()[0]]
                raise ValueError(f"{name} must hold finite values with |x| <= 1e16, got {x[tuple(at)].item()} at {at}")

    def update(self, key: torch.Tensor, value: torch.Tensor, current_start: int, *, sink_tokens: int,
               update_cache: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The engine's ``_update_cache`` on this cache: writes the chunk ``key`` / ``value``
        (``[B, n, H, D]``) at ``current_start`` when ``update_cache`` and returns the
        visible keys and values (the sink, then the newest tokens, the chunk last)."""
        if not isinstance(key, torch.Tensor) or key.dim() != 4:
            raise ValueError(f"key must be a tensor [B, n, H, D], got {getattr(key, 'shape', type(key).__name__)}")
        for name, x in (("current_start", current_start), ("sink_tokens", sink_tokens)):
            if isinstance(x, bool) or not isinstance(x, int):
                raise ValueError(f"{name} must be an integer, got {x!r}")
        n = key.shape[1]
        kind, next_sink_end = self._check(n, current_start, sink_tokens)
        if self._sink_tokens is not None and sink_tokens != self._sink_tokens:
            raise NotImplementedError(f"sink_tokens must stay {self._sink_tokens} for a qvg cache (fixed by its first "
                                      f"call), got {sink_tokens}")
        if self._pending is not None and (kind == "repeat" or self._pending != (current_start, n)):
            raise NotImplementedError(
                f"an uncommitted probe (update_cache=False) of {self._pending[1]} tokens at {self._pending[0]} is in "
                f"the qvg cache: the next call must be at that start with that size, got {n} tokens at "
                f"{current_start} (qvg cannot take a probe back)")
        if kind == "repeat" and not update_cache:
            self._check_chunk(key, value)  # read without a cache call, checked as a write would be
            if self.packed:
                raise NotImplementedError(
                    "a probe (update_cache=False) repeating the last committed start is not supported by the packed "
                    f"qvg cache (start {current_start}); LingBot's flow probes a new start, then commits it")
            prefix = self.end - n  # the engine's expression, on the same bytes
            return (torch.cat((self.key[:, :prefix], key), dim=1), torch.cat((self.value[:, :prefix], value), dim=1))
        built = self._c is None
        if built:
            self._build(current_start, sink_tokens)
        try:
            out = self._c.update_and_get_attention_kv(key=key, value=value,
                                                      current_chunk_start=current_start - self._origin)
        except BaseException:
            if built:
                self._c = None
            raise
        if update_cache:
            self.end = out.k.shape[1]
            self.absolute_end = current_start + n
            self.last_start = current_start
            self.sink_end = next_sink_end
            self._pending = None
        else:
            self._pending = (current_start, n)
        self._sink_tokens = sink_tokens
        return out.k, out.v


# ---------------------------------------------------------------------------
# install / uninstall (the drop-in contract: qvg.dropin, docs/engines.md)
# ---------------------------------------------------------------------------


def _find() -> _dropin.Found:
    module = _dropin.engine_module(__name__, ENGINE_MODULE, "pip install vllm-omni, with vLLM")
    _dropin.engine_attr(__name__, module, "allocate_lingbot_cache", own=True)
    attention = _dropin.engine_attr(__name__, module, "LingBotSelfAttention")
    _dropin.engine_attr(__name__, attention, "_update_cache", own=True)
    transformer_cache = _dropin.engine_attr(__name__, module, "LingBotTransformerCache")
    return _dropin.Found([_dropin.Attribute(module, "allocate_lingbot_cache"),
                          _dropin.Attribute(attention, "_update_cache")],
                         {"LingBotTransformerCache": transformer_cache})


def _substitutes(quant_args: Any, found: _dropin.Found) -> list[Any]:
    engine_update = found.bindings[1].original
    transformer_cache = found.names["LingBotTransformerCache"]

    def allocate_lingbot_cache(*, batch_size: int, num_layers: int, max_tokens: int, num_local_heads: int,
                               head_dim: int, device: torch.device, dtype: torch.dtype) -> Any:
        layers = [LingBotQVGCache(batch_size=batch_size, max_tokens=max_tokens, num_local_heads=num_local_heads,
                                  head_dim=head_dim, device=device, dtype=dtype, quant_args=quant_args)
                  for _ in range(num_layers)]
        return transformer_cache(self_attention=layers, cross_attention=[None for _ in range(num_layers)])

    def _update_cache(self: Any, cache: Any, key: torch.Tensor, value: torch.Tensor, current_start: int, *,
                      sink_tokens: int, update_cache: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(cache, LingBotQVGCache):
            return cache.update(key, value, current_start, sink_tokens=sink_tokens, update_cache=update_cache)
        return engine_update(self, cache, key, value, current_start, sink_tokens=sink_tokens,
                             update_cache=update_cache)

    allocate_lingbot_cache.__doc__ = "qvg.vllm_omni: the engine's allocate_lingbot_cache, with qvg caches."
    _update_cache.__doc__ = "qvg.vllm_omni: the engine's _update_cache, serving qvg caches."
    return [allocate_lingbot_cache, _update_cache]


_DROPIN = _dropin.DropIn(__name__, _find, _substitutes)


def is_installed() -> bool:
    """True between :func:`install` and :func:`uninstall`."""
    return _DROPIN.is_installed()


def install(quant_args: Any = None) -> None:
    """Makes vLLM-Omni's LingBot-World request path run on qvg: rebinds the module's
    ``allocate_lingbot_cache`` to one building :class:`LingBotQVGCache` layers (dense
    with ``quant_args=None``, else packed with these settings: anything
    :func:`qvg.torch.as_quant_args` takes, validated first) and wraps
    ``LingBotSelfAttention._update_cache``. The contract of :mod:`qvg.dropin`:
    all-or-nothing (:class:`qvg.dropin.EngineNameError`, an ImportError, naming what
    the engine lacks; nothing changed), idempotent (other settings replace the
    installed ones), thread-safe."""
    _DROPIN.install(quant_args)


def uninstall() -> None:
    """Puts the engine's ``allocate_lingbot_cache`` and ``_update_cache`` back. A no-op
    when not installed. Caches allocated while installed keep working through the
    engine's method only if it is installed again."""
    _DROPIN.uninstall()


def installed(quant_args: Any = None) -> contextlib.AbstractContextManager[None]:
    """Context manager: :func:`install` on entry; on exit, also when the block raises,
    what was installed at entry is back (nothing, or the settings then installed:
    blocks nest; :mod:`qvg.dropin`)."""
    return _DROPIN.installed(quant_args)
