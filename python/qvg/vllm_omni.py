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
  them before the next call on the cache. Non-finite values are rejected (ValueError).
* The realtime AR-diffusion engine (paged, ``experimental/ar_diffusion/kv_cache``) is
  not served: docs/engines.md says what it would need.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import torch

from . import torch as _qt

__all__ = ["LingBotQVGCache", "install", "uninstall", "installed", "is_installed", "ENGINE_MODULE"]

#: vLLM-Omni's module holding the replaced names.
ENGINE_MODULE = "vllm_omni.diffusion.models.lingbot_world.transformer"


def _quant_args(value: Any) -> Any:
    """None (dense), a QVGKVQuantArgs (or the engine's), or a dict of the engine's flags."""
    if isinstance(value, dict):
        value = _qt.QVGKVQuantArgs.from_dict(value)
    _qt._config._check_quant_args(value)
    if value is not None:
        _qt._config._quant_to_c(value).validate()
    return value


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
        self.quant_args = _quant_args(quant_args)
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
# install / uninstall
# ---------------------------------------------------------------------------

_state: dict[str, Any] = {}


def is_installed() -> bool:
    """True between :func:`install` and :func:`uninstall`."""
    return bool(_state)


def _module() -> Any:
    try:
        return importlib.import_module(ENGINE_MODULE)
    except ImportError as e:
        raise ImportError(f"qvg.vllm_omni needs vLLM-Omni's module {ENGINE_MODULE} (pip install vllm-omni, with "
                          f"vLLM); importing it failed: {e}") from e


def install(quant_args: Any = None) -> None:
    """Makes vLLM-Omni's LingBot-World request path run on qvg: rebinds the module's
    ``allocate_lingbot_cache`` to one building :class:`LingBotQVGCache` layers (dense
    with ``quant_args=None``, else packed with these settings: a QVGKVQuantArgs or a
    dict of the engine's flags) and wraps ``LingBotSelfAttention._update_cache``.
    Installing again replaces the settings. ImportError when the module cannot be
    imported."""
    quant_args = _quant_args(quant_args)
    module = _module()
    if not _state:
        _state["allocate"] = module.allocate_lingbot_cache
        _state["update"] = module.LingBotSelfAttention.__dict__["_update_cache"]
    engine_update = _state["update"]
    transformer_cache = module.LingBotTransformerCache

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
    module.allocate_lingbot_cache = allocate_lingbot_cache
    module.LingBotSelfAttention._update_cache = _update_cache
    _state["module"] = module


def uninstall() -> None:
    """Puts the engine's ``allocate_lingbot_cache`` and ``_update_cache`` back. A no-op
    when not installed. Caches allocated while installed keep working through the
    engine's method only if it is installed again."""
    if not _state:
        return
    module = _state["module"]
    module.allocate_lingbot_cache = _state["allocate"]
    module.LingBotSelfAttention._update_cache = _state["update"]
    _state.clear()


@contextlib.contextmanager
def installed(quant_args: Any = None) -> Iterator[None]:
    """Context manager: :func:`install` on entry, :func:`uninstall` on exit (also when
    the block raises)."""
    install(quant_args)
    try:
        yield
    finally:
        uninstall()
