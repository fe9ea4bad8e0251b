"""qvg.torch — drop-in replacements for the SGLang engine's causal K/V cache classes.

The multimodal-generation runtime of SGLang builds one cache per transformer block
and calls ``update_and_get_attention_kv`` once per denoising step. This module offers
the same three names with the same constructor signatures, backed by qvg's C++
caches (``include/qvg/cache.h``) through the binding module ``qvg._C``:

* :class:`QVGKVQuantArgs` — the quantization settings (spec section 2), with the
  engine's flat flag names in :meth:`QVGKVQuantArgs.from_dict`.
* :class:`CausalSelfAttentionKVCache` — the dense cache (spec 3.2) over the caller's
  ``k``/``v`` tensors ``[B, cache_size, H, D]``.
* :class:`QVGPackedCausalKVCache` — the packed QVG cache (spec 4).

Switching is an import change::

    from qvg.torch import (CausalSelfAttentionKVCache, QVGKVQuantArgs,
                           QVGPackedCausalKVCache)

Scope and differences from the engine (all deliberate):

* CPU tensors, and CUDA tensors when the extension was built with its CUDA path
  (:data:`HAS_CUDA`; docs/python.md); dtype float32, bfloat16 or float16. Keys and
  values are read in place when contiguous ``[B, n, h, D]``; otherwise a
  contiguous copy is made. A cache lives on one device: the dense cache on its
  ``k``/``v`` buffers' device, the packed cache on ``device``.
* Errors are typed as in spec 5: ``ValueError`` (bad argument, shape, dtype, values,
  configuration; key/value on another device than the cache), ``NotImplementedError``
  (packed: non-sequential write, size change of the current chunk, ``allow_growth``;
  a device this build does not support; a CUDA cache used during CUDA graph
  capture), ``RuntimeError`` (a chunk that does not fit the cache or window,
  overwrites sink tokens, or rewrites evicted positions; a CUDA runtime failure),
  ``torch.OutOfMemoryError`` (the device is full). A call that raises changes
  nothing: buffers, cursors, index tensors and ``*_int`` attributes are as before
  (after a CUDA runtime failure the cache stays consistent, not necessarily as before).
* ``debug_name`` is accepted for compatibility and not used; messages are qvg's.
* The view's ``k``/``v`` hold only the heads written by the call
  (``[cache_head_start, cache_head_start + h_in)``), as spec 3.1 says.
* Packed view: ``local_start_index, local_end_index`` locate the chunk inside the
  returned ``k``/``v`` (``T - n, T``), as spec 3.1 says.

Lifetime of the returned views (``CausalAttentionKVView.k`` / ``.v``):

* ``view.zero_copy`` True: the tensors alias cache memory (no bytes copied). Dense:
  they are views of ``cache.k``/``cache.v``, exactly as the engine's slices, so later
  calls change what they show. Packed: they alias the current chunk until the next
  call on the cache; if you still hold them then, qvg first gives them a private
  copy of their bytes (they never dangle, they just stop following the cache). Drop
  the view before the next call to avoid that copy. Raw-pointer exports of such a
  view (``.numpy()``, DLPack) are not moved along: do not keep them past the next call.
* ``view.zero_copy`` False (the visible tokens are not one contiguous range of one
  buffer: sink plus a recent window, or packed segments decoded): fresh tensors
  owned by the caller, as the engine's packed cache returns.

CUDA caches (docs/python.md, "CUDA tensors"):

* Work runs on ``torch.cuda.current_stream()`` of the cache's device, under a device
  guard (a cache on ``cuda:1`` works while ``cuda:0`` is current); update() waits
  for that stream once, to check the input values. A view is ready for work
  enqueued on that stream after the call; to read it on another stream, make that
  stream wait (``wait_stream``) and finish with it before the next call.
* Device memory comes from PyTorch's caching allocator: ``torch.cuda.memory_allocated()``
  counts ``resident_nbytes()`` plus ``view_buffer_nbytes()`` (each allocation rounded
  up to the allocator's 512-byte blocks) and ``torch.cuda.empty_cache()`` returns
  what was freed.
* Views are CUDA tensors with the lifetime rules above; copied views of a CUDA cache
  are lent from its view buffer (they receive a private copy if still alive at the
  next call), not fresh tensors.
* ``torch.compile``: a call is a graph break (the cache is opaque to dynamo);
  ``fullgraph=True`` fails. CUDA graph capture is not supported (NotImplementedError).

Not thread-safe: one caller per cache at a time (a second thread gets RuntimeError).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

import torch

from ._loader import check_build

check_build()  # ImportError naming both versions when _C was built for another torch
from . import _C  # noqa: E402  (after the check: in another torch, loading it fails with a symbol error)

#: True when the extension was built with its CUDA path (CUDA tensors supported).
HAS_CUDA: bool = bool(_C.HAS_CUDA)

__all__ = [
    "HAS_CUDA",
    "CausalAttentionKVView",
    "CausalSelfAttentionKVCache",
    "QVGKVQuantArgs",
    "QVGPackedCausalKVCache",
    "Encoding",
    "encode",
    "decode",
    "to_reference",
    "from_reference",
]

_DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


# ---------------------------------------------------------------------------
# Configuration (spec 2)
# ---------------------------------------------------------------------------

# The settings table (qvg/settings.h, issue 23): (name, flag suffix, kind, per_role,
# default) per setting. The dataclass below lists the shared settings (a test checks
# its fields and defaults against the table); per-role ones are k_config / v_config.
_SETTINGS = [s for s in _C.quant_settings() if not s[3]]
# Engine flag name -> field.
_FLAG_TO_FIELD = {"kv_cache_quant" + flag: name for name, flag, _kind, _role, _d in _SETTINGS if flag}


def _flag_text(value: Any) -> str:
    """A typed flag value (as argparse produces it) in the C++ parser's text form."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass
class QVGKVQuantArgs:
    """PRQ K/V-cache quantization settings (spec 2); the engine's ``QVGKVQuantArgs``.

    ``bits is None`` (the default) means quantization is off: every segment stays raw.
    Validation is qvg's C++ ``QuantArgs::validate`` so messages match the CLI's.
    """

    bits: int | None = None  # None = off; 2 or 4
    centroids: int = 128  # k-means centroids per stage and group, 1..256
    block_size: int = 64  # channels per residual scale; divides head_dim, multiple of 8/bits
    stages: int = 1  # k-means stages
    kmeans_iters: int = 2  # Lloyd iterations per stage
    asymmetric: bool = False  # min/max + zero point instead of absmax
    keep_recent_chunks: int = 1  # completed non-sink chunks kept raw
    sink: bool = True  # quantize the sink chunks too
    sink_span: str = "chunk"  # "chunk" (each sink chunk its own span) | "full"
    sink_keep_chunks: int = 0  # leading sink chunks never packed
    # qvg extensions
    span_chunks: int = 1  # consecutive chunks sharing one codebook
    scaling: str = "two_level"  # "two_level" | "compat"
    scale_dtype: str = "fp8_e4m3"  # "fp8_e4m3" | "bf16"
    init: str = "random"  # "random" | "kmeans++" | "warm"
    seed: int = 1234
    span_mode: str = "deferred"  # "deferred" | "incremental" (docs/spans.md)
    span_break_ratio: float = 0.0  # incremental: start a new span above this residual-energy ratio; 0 = never
    refine_recent: int = 0  # incremental: the newest N encoded chunks keep a refinement layer (docs/spans.md); 0 = none
    refine_bits: int = 4  # the refinement layer's code width: 2 or 4
    scale_search: str = "off"  # "off" | "mse": the encoder's choice of block scales (docs/quality.md)
    k_config: str = ""  # K's own codec settings over the shared ones: "bits=4,asymmetric=true" ("" = none)
    v_config: str = ""  # V's own codec settings (as k_config)

    @property
    def enabled(self) -> bool:
        return self.bits is not None

    def validate(self) -> QVGKVQuantArgs:
        """Raises ValueError naming the field, the value and what is allowed; returns self."""
        _quant_to_c(self).validate()
        return self

    def describe(self) -> str:
        return _quant_to_c(self).describe()

    @classmethod
    def from_dict(cls, kwargs: dict) -> QVGKVQuantArgs:
        """Builds the settings from the engine's flat flags (``kv_cache_quant``,
        ``kv_cache_quant_centroids``, ``_block_size``, ``_stages``, ``_iters``,
        ``_keep_recent``, ``_sink_keep``, ``_asymmetric``, ``_sink``, ``_sink_span``,
        and qvg's ``_span_chunks``, ``_span_mode``, ``_span_break_ratio``, ``_refine_recent``, ``_refine_bits``,
        ``_scaling``, ``_scale_dtype``, ``_init``, ``_seed``, ``_scale_search``,
        ``_profile`` ("reference" | "hq", applied first: explicit flags override it) and
        the per-role ``_k_<f>`` / ``_v_<f>`` (f in bits, centroids, block_size, stages,
        iters, asymmetric, scale_dtype, scaling, scale_search)). Values may be typed (ints, bools) or strings; ``None`` means
        "not given". Without ``kv_cache_quant`` everything is default (off), as in
        the engine. Other keys are ignored. Raises ValueError on bad values."""
        if not isinstance(kwargs, dict):
            raise ValueError(f"kwargs must be a dict of the engine's flags (kv_cache_quant, ...), "
                             f"got {type(kwargs).__name__}")
        master = kwargs.get("kv_cache_quant")
        if master is None:
            return cls()
        flags = {"kv_cache_quant": str(master).strip().lower()}
        for flag in _FLAG_TO_FIELD:
            value = kwargs.get(flag)
            if value is not None:
                flags[flag] = _flag_text(value)
        # Issue 16: the profile (applied first; explicit flags override it), the scale
        # search and the per-role keys kv_cache_quant_k_<f> / kv_cache_quant_v_<f>
        # (an unknown <f> is a ValueError from the C++ parser).
        for flag, value in kwargs.items():
            if value is None or not isinstance(flag, str):
                continue
            if flag in ("kv_cache_quant_profile", "kv_cache_quant_scale_search") or flag.startswith(
                ("kv_cache_quant_k_", "kv_cache_quant_v_")
            ):
                flags[flag] = _flag_text(value)
        return cls(**_C.quant_args_from_flags(flags))


_QUANT_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(QVGKVQuantArgs)}
_KIND = {name: kind for name, _flag, kind, _role, _d in _SETTINGS}
_INT_FIELDS = tuple(n for n, k in _KIND.items() if k in ("int", "width"))
_BOOL_FIELDS = tuple(n for n, k in _KIND.items() if k == "bool")
_STR_FIELDS = tuple(n for n, k in _KIND.items() if k == "name") + ("k_config", "v_config")
_FLOAT_FIELDS = tuple(n for n, k in _KIND.items() if k == "real")


# The fields of the engine's own QVGKVQuantArgs (SGLang): an object with all of them
# is accepted as the engine's settings (qvg's extensions take their defaults).
_ENGINE_FIELDS = ("bits", "centroids", "block_size", "stages", "kmeans_iters", "asymmetric", "keep_recent_chunks",
                  "sink", "sink_keep_chunks")


def _check_quant_args(q: Any, what: str = "quant_args") -> None:
    """Issue 27, item 8: settings are a QVGKVQuantArgs, the engine's class (an object
    with its fields), or None; anything else (a dict of flags, "int2", 2) would
    silently turn quantization off, so it is refused naming the argument."""
    if q is None or isinstance(q, QVGKVQuantArgs):
        return
    if not isinstance(q, (dict, str, bytes, int, float)) and all(hasattr(q, f) for f in _ENGINE_FIELDS):
        return
    hint = " (use QVGKVQuantArgs.from_dict for the engine's flat flags)" if isinstance(q, dict) else ""
    raise ValueError(f"{what} must be a QVGKVQuantArgs (qvg's, or the engine's with its fields "
                     f"{', '.join(_ENGINE_FIELDS)}) or None, got "
                     f"{type(q).__name__} {q!r:.80}{hint}")


def _quant_to_c(q: Any, what: str = "quant_args") -> _C.QuantArgs:
    """A QVGKVQuantArgs (ours or the engine's; missing qvg extensions take their
    defaults) -> the C++ QuantArgs (not yet validated)."""
    _check_quant_args(q, what)
    if q is None:
        q = QVGKVQuantArgs()
    v = {name: getattr(q, name, default) for name, default in _QUANT_DEFAULTS.items()}
    if v["bits"] is not None and (isinstance(v["bits"], bool) or not isinstance(v["bits"], int)):
        raise ValueError(f"bits must be 2 or 4 (or none to disable quantization), got {v['bits']!r}")
    for name in _INT_FIELDS + ("seed",):
        if isinstance(v[name], bool) or not isinstance(v[name], int):
            raise ValueError(f"{name} must be an integer, got {v[name]!r}")
    if v["seed"] < 0 or v["seed"] >= 2**64:
        raise ValueError(f"seed must be in [0, 2^64), got {v['seed']}")
    for name in _BOOL_FIELDS:
        if not isinstance(v[name], bool):
            raise ValueError(f"{name} must be a boolean (True/False), got {v[name]!r}")
    for name in _STR_FIELDS:
        if not isinstance(v[name], str):
            raise ValueError(f"{name} must be a string, got {v[name]!r}")
    for name in _FLOAT_FIELDS:
        if isinstance(v[name], bool) or not isinstance(v[name], (int, float)):
            raise ValueError(f"{name} must be a number, got {v[name]!r}")
        v[name] = float(v[name])
    for name in _INT_FIELDS + ("bits",):
        x = v[name]
        if x is not None and not -(2**31) < x < 2**31:
            raise ValueError(f"{name} must fit in 32 bits, got {x}")
    return _C.QuantArgs(v)


def _cache_device(device: torch.device | str) -> torch.device:
    """The packed cache's device: the CPU, or a CUDA device with the CUDA path (spec 5:
    NotImplementedError for a device this build does not support)."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda" or not HAS_CUDA:
        if not HAS_CUDA:
            raise NotImplementedError(
                f"QVGPackedCausalKVCache: qvg.torch runs on the CPU in this build, device must be 'cpu', got '{dev}'"
            )
        raise NotImplementedError(f"QVGPackedCausalKVCache: device must be 'cpu' or a CUDA device, got '{dev}'")
    if not torch.cuda.is_available():
        raise RuntimeError(f"QVGPackedCausalKVCache: device '{dev}' is not available (torch.cuda.is_available() is False)")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.index >= torch.cuda.device_count():
        raise ValueError(
            f"QVGPackedCausalKVCache: device '{dev}' does not exist: {torch.cuda.device_count()} CUDA device(s) visible"
        )
    return dev


# ---------------------------------------------------------------------------
# Arguments at the Python boundary (spec 5.1; issue 27, items 4 and 11)
# ---------------------------------------------------------------------------

_I64_MAX = 2**63 - 1
_I32_MAX = 2**31 - 1


def _int_arg(what: str, x: Any, *, lo: int = -(2**63), hi: int = _I64_MAX, none: bool = False) -> int | None:
    """``x`` as an int in [lo, hi] (None allowed when ``none``), else ValueError naming
    ``what``, the value and what is allowed (never pybind's generic TypeError). The
    default range is what the C++ side can take: its own checks (and messages, e.g.
    ``recent_window_tokens must be >= 0 or None``) come after."""
    if x is None and none:
        return None
    allowed = ("an integer" if lo == -(2**63) and hi == _I64_MAX else f"an integer in [{lo}, {hi}]") + (
        " (64-bit)" if lo == -(2**63) else "") + (" or None" if none else "")
    if isinstance(x, bool) or not isinstance(x, int):
        try:
            import numpy as np  # numpy integers are integers too
            if isinstance(x, np.integer):
                x = int(x)
            else:
                raise ValueError
        except (ImportError, ValueError):
            raise ValueError(f"{what} must be {allowed}, got {type(x).__name__} {x!r:.60}") from None
    if not lo <= x <= hi:
        raise ValueError(f"{what} must be {allowed}, got {x}")
    return x


def _tensor_arg(what: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{what} must be a torch.Tensor [B, n, h, D], got {type(t).__name__}")
    return t


def _index_tensor(what: str, t: Any, device: torch.device | None) -> torch.Tensor:
    """An index tensor of the engine's interface: one int64 (or int32) element on the
    CPU or the cache's device; anything else is ValueError naming ``what``."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{what} must be a torch.Tensor of one int64 (or int32) element, e.g. "
                         f"torch.zeros(1, dtype=torch.long), got {type(t).__name__} {t!r:.60}")
    if t.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{what} must have dtype torch.int64 (or torch.int32), got {t.dtype}")
    if t.layout != torch.strided or t.numel() != 1:
        raise ValueError(f"{what} must hold exactly one element, got shape {tuple(t.shape)}")
    if t.device.type != "cpu" and (device is None or t.device != device):
        raise ValueError(f"{what} must be on the CPU or the cache's device {device}, got {t.device}")
    return t


class _IndexTensors:
    """The engine's index tensors, validated when set (at construction and after)."""

    _device: torch.device | None = None

    @property
    def global_end_index(self) -> torch.Tensor:
        return self._global_end_index

    @global_end_index.setter
    def global_end_index(self, t: torch.Tensor) -> None:
        self._global_end_index = _index_tensor("global_end_index", t, self._device)

    @property
    def local_end_index(self) -> torch.Tensor:
        return self._local_end_index

    @local_end_index.setter
    def local_end_index(self, t: torch.Tensor) -> None:
        self._local_end_index = _index_tensor("local_end_index", t, self._device)

    def _check_cursor_fits(self, end: int) -> None:
        """Before the cache changes: a cursor up to ``end`` must fit the index tensors
        (an int32 tensor holds at most 2^31 - 1), so cursors never change without the cache."""
        for what, t in (("global_end_index", self._global_end_index), ("local_end_index", self._local_end_index)):
            if t.dtype == torch.int32 and end > _I32_MAX:
                raise ValueError(f"{what} is an int32 tensor and cannot hold the cursor {end} this call would "
                                 f"set (at most 2^31 - 1); use torch.int64")


# ---------------------------------------------------------------------------
# The view
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class CausalAttentionKVView:
    """What ``update_and_get_attention_kv`` returns (spec 3.1); the engine's class
    of the same name plus ``zero_copy`` (True: k/v alias cache memory)."""

    k: torch.Tensor  # [B, T, h_in, D], the visible tokens in global order
    v: torch.Tensor
    local_start_index: int
    local_end_index: int
    visible_local_end: int  # min(global_end, cache_size)
    visible_global_end: int  # global_end after the call
    zero_copy: bool = False


# ---------------------------------------------------------------------------
# What both caches share (spec 3.1)
# ---------------------------------------------------------------------------


class _CacheInterface(_IndexTensors):
    """The engine's cache interface on top of a ``qvg._C`` cache (``self._c``):
    byte counts, direct attention, cursor reset and the update call. Subclasses
    implement ``_update(key, value, c, hs, rw) -> (k, v, ls, le, vle, vge, zero_copy)``
    and ``_set_cursors(global_end, local_end)``."""

    _c: Any  # the qvg._C cache
    global_end_index_int: int | None
    local_end_index_int: int | None

    def _update(self, key: torch.Tensor, value: torch.Tensor, c: int, hs: int | None,
                rw: int | None) -> tuple[torch.Tensor, torch.Tensor, int, int, int, int, bool]:
        raise NotImplementedError

    def _set_cursors(self, global_end: int, local_end: int) -> None:
        raise NotImplementedError

    def can_direct_current_attention(self, num_new_tokens: int) -> bool:
        return self._c.can_direct_current_attention(num_new_tokens)

    def resident_nbytes(self) -> int:
        """Bytes of the cache state: the dense cache's buffers (2 * B * cache_size * H * D
        * itemsize), or the packed cache's raw segments and encoded spans."""
        return self._c.resident_nbytes()

    def peak_transient_nbytes(self) -> int:
        """Most bytes the last successful call held beyond the resident state (spec 3.1).
        CPU caches only: the CUDA caches do not track it (NotImplementedError; see
        :meth:`view_buffer_nbytes`)."""
        if not hasattr(self._c, "peak_transient_nbytes"):
            raise NotImplementedError(
                f"peak_transient_nbytes is not tracked by the CUDA caches (device {self._c.device}); "
                "view_buffer_nbytes() gives the view buffer they hold now"
            )
        return self._c.peak_transient_nbytes()

    def view_buffer_nbytes(self) -> int:
        """CUDA caches: bytes of the device view buffer held now (the last copied view),
        which ``torch.cuda.memory_allocated()`` counts besides :meth:`resident_nbytes`.
        CPU caches return their copied views as fresh tensors: NotImplementedError."""
        if not hasattr(self._c, "view_buffer_nbytes"):
            raise NotImplementedError("view_buffer_nbytes is reported by the CUDA caches only (CPU caches return copied "
                                      "views as fresh tensors; see peak_transient_nbytes)")
        return self._c.view_buffer_nbytes()

    def reset_indices(self) -> None:
        """Dense: cursors to 0 (buffer content is kept). Packed: drops every segment
        (an empty cache). Both zero the index tensors and the int cursors in use."""
        self._c.reset_indices()
        self.global_end_index.zero_()
        self.local_end_index.zero_()
        if self.global_end_index_int is not None:
            self.global_end_index_int = 0
        if self.local_end_index_int is not None:
            self.local_end_index_int = 0

    def update_and_get_attention_kv(
        self,
        *,
        key: torch.Tensor,
        value: torch.Tensor,
        current_chunk_start: int,
        cache_head_start: int | None = None,
        recent_window_tokens: int | None = None,
        debug_name: str = "causal KV cache",
    ) -> CausalAttentionKVView:
        """Writes the chunk ``[current_chunk_start, + n)`` of ``key``/``value``
        (``[B, n, h_in, D]``) and returns the tokens visible to it (dense: spec 3.2;
        packed: the sink, then the recent tail, spec 4). Every argument is checked
        before the cache changes (spec 5.1)."""
        key = _tensor_arg("key", key)
        value = _tensor_arg("value", value)
        current_chunk_start = _int_arg("current_chunk_start", current_chunk_start)
        cache_head_start = _int_arg("cache_head_start", cache_head_start, none=True)
        recent_window_tokens = _int_arg("recent_window_tokens", recent_window_tokens, none=True)
        if key.dim() == 4:
            self._check_cursor_fits(current_chunk_start + key.shape[1])
        k, v, ls, lend, vle, vge, zero_copy = self._update(
            key, value, current_chunk_start, cache_head_start, recent_window_tokens
        )
        self._set_cursors(vge, vle)
        return CausalAttentionKVView(k, v, ls, lend, vle, vge, zero_copy)


# ---------------------------------------------------------------------------
# The dense cache (spec 3.2)
# ---------------------------------------------------------------------------


class CausalSelfAttentionKVCache(_CacheInterface):
    """One transformer block's dense causal self-attention K/V cache and cursors.

    ``k``, ``v``: the buffers, tensors ``[B, cache_size, H, D]``, contiguous, on the CPU
    or (CUDA path) one CUDA device, which is then the cache's device; the cache
    writes into them in place (they are its storage). With ``allow_growth`` a
    growth replaces them by new, larger tensors, read back through ``cache.k`` /
    ``cache.v`` as in the engine.

    ``global_end_index``, ``local_end_index``: index tensors (e.g. ``torch.zeros(1,
    dtype=torch.long)``). As in the engine, the cursors are read from them on the
    first call unless both ``*_int`` cursors are given, are kept in
    ``global_end_index_int`` / ``local_end_index_int`` from then on (the source of
    truth), and the tensors are written only when a call changes the cursors.

    ``cache_size``: 0 or ``k.shape[1]``. ``attention_window_size``: 0 (= cache_size)
    or 1..cache_size tokens shown by a view. ``sink_tokens``: leading tokens never
    evicted.
    """

    def __init__(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        global_end_index: torch.Tensor,
        local_end_index: torch.Tensor,
        global_end_index_int: int | None = None,
        local_end_index_int: int | None = None,
        cache_size: int = 0,
        sink_tokens: int = 0,
        attention_window_size: int = 0,
        allow_growth: bool = False,
        global_sink_tokens: int = 0,
    ) -> None:
        sink_tokens = _int_arg("sink_tokens", sink_tokens)
        attention_window_size = _int_arg("attention_window_size", attention_window_size, none=True)
        cache_size = _int_arg("cache_size", cache_size)
        global_end_index_int = _int_arg("global_end_index_int", global_end_index_int, none=True)
        local_end_index_int = _int_arg("local_end_index_int", local_end_index_int, none=True)
        if global_sink_tokens:
            raise NotImplementedError(
                "CausalSelfAttentionKVCache: global_sink_tokens (the engine's pinned sink of longlive2) is not "
                f"supported by qvg, it must be 0, got {global_sink_tokens!r}"
            )
        window = None if not attention_window_size else attention_window_size
        on_cuda = HAS_CUDA and isinstance(k, torch.Tensor) and k.device.type == "cuda"
        if on_cuda:
            self._device = k.device
        self.global_end_index = global_end_index  # validated (spec 5.1) before anything is built
        self.local_end_index = local_end_index
        self._c = (_C.CudaDenseCache if on_cuda else _C.DenseCache)(k, v, sink_tokens, window, bool(allow_growth))
        if cache_size and cache_size != self._c.cache_size:
            raise ValueError(
                f"cache_size must be 0 or k.shape[1] = {self._c.cache_size} (the buffers hold the cache), "
                f"got {cache_size}"
            )
        self.global_end_index_int = global_end_index_int
        self.local_end_index_int = local_end_index_int

    # -- the engine's fields ---------------------------------------------------------
    @property
    def k(self) -> torch.Tensor:
        return self._c.k

    @property
    def v(self) -> torch.Tensor:
        return self._c.v

    @property
    def cache_size(self) -> int:
        return self._c.cache_size

    @property
    def sink_tokens(self) -> int:
        return self._c.sink_tokens

    @property
    def attention_window_size(self) -> int:
        return self._c.attention_window_size

    @property
    def allow_growth(self) -> bool:
        return self._c.allow_growth

    @property
    def num_cache_heads(self) -> int:
        return self._c.num_heads

    @property
    def global_sink_tokens(self) -> int:
        """Always 0: qvg has no pinned global sink (docs/compat.md)."""
        return 0

    def reset_pinned_sink(self) -> None:
        """The engine's reset of a pinned sink: nothing is ever pinned in qvg, a no-op."""

    def pin_current_chunk(self, current_num_tokens: int) -> None:
        """The engine pins the current chunk as a sink (longlive2); qvg does not support
        it. As in the engine, a cache without sink tokens (or an empty chunk) only resets
        the pin: a no-op here. Otherwise NotImplementedError."""
        if self.sink_tokens <= 0 or current_num_tokens <= 0:
            return
        raise NotImplementedError(
            "CausalSelfAttentionKVCache does not support pinning the current chunk as a sink "
            f"(sink_tokens = {self.sink_tokens}, got current_num_tokens={current_num_tokens})"
        )

    # The newer engine also lets callers treat the cache as a mapping of its fields.
    _FIELD_NAMES = frozenset(
        {"k", "v", "global_end_index", "local_end_index", "global_end_index_int", "local_end_index_int"}
    )

    def __getitem__(self, key: str) -> Any:
        if key not in self._FIELD_NAMES:
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self._FIELD_NAMES:
            raise KeyError(key)
        if key in ("k", "v"):
            raise NotImplementedError(f"the buffers of a qvg cache cannot be replaced; build a new cache, got key {key!r}")
        setattr(self, key, value)

    def __contains__(self, key: str) -> bool:
        return key in self._FIELD_NAMES and getattr(self, key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        if key not in self._FIELD_NAMES:
            return default
        value = getattr(self, key)
        return default if value is None else value

    # -- snapshots (docs/snapshot.md) ---------------------------------------------------
    def _cursors(self) -> tuple[int, int]:
        ge, le = self.global_end_index_int, self.local_end_index_int
        if ge is None or le is None:
            return int(self.global_end_index.item()), int(self.local_end_index.item())
        return ge, le

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the cache (configuration, cursors, the buffers, checksums) to ``path``
        atomically: a crash leaves the previous file. ValueError naming the path on an
        I/O error. CPU caches only (NotImplementedError for a CUDA one)."""
        self._c.save(os.fspath(path), *self._cursors())

    def snapshot_bytes(self) -> bytes:
        """The bytes :meth:`save` writes."""
        return self._c.snapshot_bytes(*self._cursors())

    @classmethod
    def load(cls, path: str | os.PathLike[str], **kwargs: Any) -> CausalSelfAttentionKVCache:
        """A cache restored from a snapshot written by :meth:`save`. ``kwargs`` are the
        constructor's: ``k``/``v`` of the size the saved cache was built with (they give
        the expected configuration; the loaded cache's buffers are new tensors, read
        through ``cache.k`` / ``cache.v`` as after a growth), the cursor tensors and
        options. A snapshot of another configuration is ValueError naming the field; a
        truncated or altered file is ValueError naming the section. The cursors (int and
        tensors) are set from the snapshot. CPU caches only."""
        cache = cls(**kwargs)
        cache._c.restore(os.fspath(path), False)
        cache._adopt_loaded_cursors()
        return cache

    @classmethod
    def from_snapshot_bytes(cls, data: bytes, **kwargs: Any) -> CausalSelfAttentionKVCache:
        """:meth:`load` from the bytes of a snapshot."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueError(f"data must be bytes, got {type(data).__name__}")
        cache = cls(**kwargs)
        cache._c.restore(bytes(data), True)
        cache._adopt_loaded_cursors()
        return cache

    def _adopt_loaded_cursors(self) -> None:
        ge, le = self._c.global_end, self._c.local_end
        self.global_end_index.fill_(ge)
        self.local_end_index.fill_(le)
        self.global_end_index_int = ge
        self.local_end_index_int = le

    # -- the interface (_CacheInterface) -----------------------------------------------
    def _update(self, key, value, c, hs, rw):
        ge = self.global_end_index_int
        le = self.local_end_index_int
        if ge is None or le is None:
            ge = int(self.global_end_index.item())
            le = int(self.local_end_index.item())
        out = self._c.update(key, value, c, hs, rw, ge, le)
        self._cursors_before = (ge, le)
        return out

    def _set_cursors(self, global_end: int, local_end: int) -> None:
        # The index tensors are written only when the call changed the cursors.
        if (global_end, local_end) != self._cursors_before:
            self.global_end_index.fill_(global_end)
            self.local_end_index.fill_(local_end)
        self.global_end_index_int = global_end
        self.local_end_index_int = local_end


# ---------------------------------------------------------------------------
# The packed cache (spec 4)
# ---------------------------------------------------------------------------


class QVGPackedCausalKVCache(_CacheInterface):
    """Chunk-segmented causal K/V cache whose completed chunks are PRQ-packed (spec 4).

    Same call contract as :class:`CausalSelfAttentionKVCache`; writes must be a
    rewrite of the current chunk (same size) or an advance at ``global_end``.
    ``global_end_index`` / ``local_end_index`` are written after every call, unless
    ``use_int_indices``: then only ``global_end_index_int`` / ``local_end_index_int``
    are (the tensors are zeroed by :meth:`reset_indices` only), as in the engine.
    ``device``: the CPU, or (CUDA path) a CUDA device (``"cuda"`` means the current
    one); the CUDA cache encodes with ``init`` random only. ``quant_args``:
    :class:`QVGKVQuantArgs` or any object with its attributes (the engine's); ``None``
    means off. ``allow_growth`` (qvg only) must stay False. ``head_offset`` (qvg
    only): the global index of this cache's first head when it holds a head shard
    of a wider cache (:mod:`qvg.distributed`); the shard's encodings then equal the
    wide cache's for those heads bit for bit.
    """

    def __init__(
        self,
        *,
        batch_size: int,
        cache_size: int,
        num_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        global_end_index: torch.Tensor,
        local_end_index: torch.Tensor,
        use_int_indices: bool = False,
        sink_tokens: int = 0,
        attention_window_size: int | None = None,
        quant_args: QVGKVQuantArgs | None,
        allow_growth: bool = False,
        head_offset: int = 0,
    ) -> None:
        for what, x in (("batch_size", batch_size), ("cache_size", cache_size), ("num_heads", num_heads),
                        ("head_dim", head_dim), ("sink_tokens", sink_tokens)):
            _int_arg(what, x)
        _int_arg("attention_window_size", attention_window_size, none=True)
        _check_quant_args(quant_args)
        dev = _cache_device(device)
        self._device = dev
        self.global_end_index = global_end_index  # validated (spec 5.1) before anything is built
        self.local_end_index = local_end_index
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"dtype must be one of torch.float32, torch.bfloat16, torch.float16, got {dtype}")
        if isinstance(head_offset, bool) or not isinstance(head_offset, int):
            raise ValueError(f"head_offset must be an integer in [0, 2^40], got {head_offset!r}")
        if quant_args is None:
            quant_args = QVGKVQuantArgs()
        window = attention_window_size or None
        args = (batch_size, cache_size, num_heads, head_dim, _DTYPE_NAMES[dtype], sink_tokens, window,
                bool(allow_growth), _quant_to_c(quant_args), head_offset)
        self._c = _C.CudaPackedCache(*args, str(dev)) if dev.type == "cuda" else _C.PackedCache(*args)
        self.head_offset = head_offset
        self.batch_size = batch_size
        self.cache_size = cache_size
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = dev
        self.sink_tokens = sink_tokens
        self.attention_window_size = attention_window_size or cache_size
        self.q = quant_args
        self.global_end_index_int = 0 if use_int_indices else None
        self.local_end_index_int = 0 if use_int_indices else None

    @property
    def quant_args(self) -> Any:
        return self.q

    @property
    def num_cache_heads(self) -> int:
        return self.num_heads

    @property
    def chunk_tokens(self) -> int | None:
        """Size of the first advance's chunk; None while the cache is empty."""
        return self._c.chunk_tokens

    def pin_current_chunk(self, current_num_tokens: int) -> None:
        raise NotImplementedError(
            "QVGPackedCausalKVCache does not support pinning the current chunk as a sink "
            f"(got current_num_tokens={current_num_tokens})"
        )

    # -- snapshots (docs/snapshot.md) ---------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the cache (configuration, cursors, every segment as held in memory,
        warm-start codebooks, checksums) to ``path`` atomically: a crash leaves the
        previous file. ValueError naming the path on an I/O error; the cache is unchanged."""
        self._cpu_only("save")
        self._c.save(os.fspath(path))

    def snapshot_bytes(self) -> bytes:
        """The bytes :meth:`save` writes."""
        self._cpu_only("snapshot_bytes")
        return self._c.snapshot_bytes()

    @classmethod
    def load(cls, path: str | os.PathLike[str], **kwargs: Any) -> QVGPackedCausalKVCache:
        """A cache restored from a snapshot written by :meth:`save`. ``kwargs`` are the
        constructor's (the model's configuration, cursor tensors included): the snapshot
        must hold a cache of exactly these options and quant args, else ValueError naming
        the first differing field. A truncated or altered file is ValueError naming the
        section (spec 5: corrupt data). The cursors are set from the snapshot. Every later
        call returns what the saved cache would have returned, bit for bit. CPU only."""
        cache = cls(**kwargs)
        cache._cpu_only("load")
        cache._c.restore(os.fspath(path), False)
        cache._set_cursors(cache._c.global_end, cache._c.local_end)
        return cache

    @classmethod
    def from_snapshot_bytes(cls, data: bytes, **kwargs: Any) -> QVGPackedCausalKVCache:
        """:meth:`load` from the bytes of a snapshot."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueError(f"data must be bytes, got {type(data).__name__}")
        cache = cls(**kwargs)
        cache._cpu_only("from_snapshot_bytes")
        cache._c.restore(bytes(data), True)
        cache._set_cursors(cache._c.global_end, cache._c.local_end)
        return cache

    def _cpu_only(self, what: str) -> None:
        if self.device.type != "cpu":
            raise NotImplementedError(f"QVGPackedCausalKVCache.{what}: snapshots of a CUDA cache are not supported "
                                      f"from Python yet (device {self.device}); use a CPU cache")

    # -- the interface (_CacheInterface) -----------------------------------------------
    def _update(self, key, value, c, hs, rw):
        return self._c.update(key, value, c, hs, rw)

    def _set_cursors(self, global_end: int, local_end: int) -> None:
        # With int cursors only those are written (as in the engine).
        if self.global_end_index_int is not None:
            self.global_end_index_int = global_end
            self.local_end_index_int = local_end
        else:
            self.global_end_index.fill_(global_end)
            self.local_end_index.fill_(local_end)

    # -- for tests and diagnostics ------------------------------------------------------
    def _segments(self) -> list[dict]:
        """One dict per segment: g0, g1, is_sink, packed, current, chunks, k_ptr,
        v_ptr (raw buffers' addresses, 0 when packed), nbytes."""
        keys = ("g0", "g1", "is_sink", "packed", "current", "chunks", "k_ptr", "v_ptr", "nbytes")
        return [dict(zip(keys, s)) for s in self._c.segments()]


# ---------------------------------------------------------------------------
# The codec, and interop with the reference codec (quant-videogen; docs/compat.md)
# ---------------------------------------------------------------------------

_FROM_TEXT = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_SCALE_TORCH = {"fp8_e4m3": torch.float8_e4m3fn, "bf16": torch.bfloat16}
_REFERENCE_KEYS = ("centroids_list", "cluster_ids_list", "residual_quant", "scales", "zeros")


@dataclass(frozen=True)
class Encoding:
    """One encoded tensor (spec 1.5): ``layout`` (dtype, shape ``[B, S, H, D]`` of the
    input, bits, block_size, stages, centroids, asymmetric, scale_dtype, scaling) and
    ``arrays``, each array's raw bytes as a 1-D uint8 CPU tensor, named as in spec 1.5
    (``centroids.<s>``, ``ids.<s>``, ``codes``, ``scales``, ``zeros``, ``scale_factor``,
    ``zero_factor``), row-major in the shapes spec 1.5 gives (``[B, H, ...]``)."""

    layout: dict
    arrays: dict

    def nbytes(self) -> int:
        """The encoded size in bytes (the sum of the arrays)."""
        return sum(int(a.numel()) for a in self.arrays.values())


def encode(x: torch.Tensor, quant: QVGKVQuantArgs) -> Encoding:
    """Encodes ``x`` (``[B, S, H, D]``, CPU, float32/bfloat16/float16) with the codec
    settings of ``quant`` (bits 2 or 4; centroids, block_size, stages, kmeans_iters,
    asymmetric, scale_dtype, scaling, init random or kmeans++, seed), as the packed
    cache encodes a segment. ValueError for bad settings or input."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor [B, S, H, D], got {type(x).__name__}")
    if x.device.type != "cpu":
        raise ValueError(f"x must be a CPU tensor (the codec functions run on the CPU), got device '{x.device}'")
    q = _quant_to_c(quant, "quant")
    q.validate()
    layout, arrays = _C.encode(x, q)
    return Encoding(dict(layout), dict(arrays))


def decode(encoding: Encoding) -> torch.Tensor:
    """The decoded ``[B, S, H, D]`` tensor (spec 1.3) in the layout's dtype. Checks the
    arrays' presence, sizes and values first (ValueError naming the array)."""
    return _C.decode(dict(encoding.layout), dict(encoding.arrays))


def _typed(encoding: Encoding, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    return encoding.arrays[name].view(dtype).reshape(shape).clone()


def to_reference(encoding: Encoding) -> dict:
    """The reference codec's packed dict of a ``compat`` encoding, as
    ``quant_videogen.functions.triton_prq_quantize_tensor`` returns it for the tensor
    ``[B, H, S, D]`` (the engine's permutation of the cache's ``[B, S, H, D]``):
    ``centroids_list`` (per stage ``[B, H, K, D]``, the encoding's dtype),
    ``cluster_ids_list`` (per stage ``[B, H, S]`` uint8), ``residual_quant``
    (``[B, H, S, D * bits / 8]`` uint8, the reference's bit order), ``scales``
    (``[B, H, S, D / block_size]`` float8_e4m3fn or bfloat16) and ``zeros`` (as scales,
    or None when symmetric). ``triton_prq_dequantize_tensor(d, block_size, bits,
    output_dtype)`` of it is ``decode(encoding).permute(0, 2, 1, 3)``. New tensors
    (copies). ValueError for a ``two_level`` encoding (its per-group factors have no
    place in the reference's dict: encode with ``scaling="compat"``)."""
    lay = encoding.layout
    if lay["scaling"] != "compat":
        raise ValueError(
            f"to_reference needs an encoding with scaling 'compat' (the reference stores each block's scale "
            f"directly), got scaling '{lay['scaling']}'"
        )
    B, S, H, D = lay["shape"]
    K, bits, bs = lay["centroids"], lay["bits"], lay["block_size"]
    dtype, sdt = _FROM_TEXT[lay["dtype"]], _SCALE_TORCH[lay["scale_dtype"]]
    return {
        "centroids_list": [_typed(encoding, f"centroids.{s}", dtype, (B, H, K, D)) for s in range(lay["stages"])],
        "cluster_ids_list": [_typed(encoding, f"ids.{s}", torch.uint8, (B, H, S)) for s in range(lay["stages"])],
        "residual_quant": _typed(encoding, "codes", torch.uint8, (B, H, S, D * bits // 8)),
        "scales": _typed(encoding, "scales", sdt, (B, H, S, D // bs)),
        "zeros": _typed(encoding, "zeros", sdt, (B, H, S, D // bs)) if lay["asymmetric"] else None,
    }


def _ref_tensor(packed: dict, key: str, index: int | None = None) -> torch.Tensor:
    value = packed[key] if index is None else packed[key][index]
    where = key if index is None else f"{key}[{index}]"
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"reference dict key '{where}' must be a torch.Tensor, got {type(value).__name__}")
    return value


def _ref_check(where: str, t: torch.Tensor, dtypes: tuple, shape: tuple[int, ...]) -> None:
    if t.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise ValueError(f"reference dict key '{where}' must have dtype {names}, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"reference dict key '{where}' must have shape {list(shape)}, got {list(t.shape)}")


def from_reference(packed: dict, block_size: int, bits: int) -> Encoding:
    """A ``compat`` :class:`Encoding` of the reference codec's packed dict (what
    ``triton_prq_quantize_tensor`` returns for ``[B, H, S, D]``; keys as in
    :func:`to_reference`); :func:`decode` of it is ``[B, S, H, D]`` in the centroids'
    dtype, and ``decode(e).permute(0, 2, 1, 3).to(output_dtype)`` equals the
    reference's ``triton_prq_dequantize_tensor(packed, block_size, bits, output_dtype)``.
    Every key, dtype and shape is checked before anything is converted: ValueError
    naming the key (missing keys, wrong dtypes, inconsistent shapes, the percentile
    clipping keys ``residual``/``scale_factor`` which qvg does not support), and the
    values (ids in range, finite scales) by the decoder's own checks. The input is
    never modified; the result holds copies (on the CPU)."""
    if not isinstance(packed, dict):
        raise ValueError(f"the reference packed state must be a dict, got {type(packed).__name__}")
    for key in _REFERENCE_KEYS[:4]:
        if key not in packed:
            raise ValueError(f"reference dict key '{key}' is missing (needs {', '.join(_REFERENCE_KEYS[:4])})")
    for key in ("residual", "scale_factor"):
        if packed.get(key) is not None:
            raise ValueError(f"reference dict key '{key}' (percentile clipping) is not supported by qvg")
    if bits not in (2, 4) or isinstance(bits, bool):
        raise ValueError(f"bits must be 2 or 4, got {bits!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    for key in ("centroids_list", "cluster_ids_list"):
        if not isinstance(packed[key], (list, tuple)) or not packed[key]:
            raise ValueError(f"reference dict key '{key}' must be a non-empty list of tensors, got {packed[key]!r:.80}")
    stages = len(packed["centroids_list"])
    if len(packed["cluster_ids_list"]) != stages:
        raise ValueError(f"reference dict key 'cluster_ids_list' must have one tensor per stage ({stages}, as "
                         f"centroids_list), got {len(packed['cluster_ids_list'])}")
    c0 = _ref_tensor(packed, "centroids_list", 0)
    if c0.dim() != 4:
        raise ValueError(f"reference dict key 'centroids_list[0]' must be 4-D [B, H, K, D], got shape {list(c0.shape)}")
    B, H, K, D = c0.shape
    cdtypes = (torch.float32, torch.bfloat16, torch.float16)
    for s in range(stages):
        _ref_check(f"centroids_list[{s}]", _ref_tensor(packed, "centroids_list", s), (c0.dtype,) if s else cdtypes,
                   (B, H, K, D))
    ids0 = _ref_tensor(packed, "cluster_ids_list", 0)
    if ids0.dim() != 3:
        raise ValueError(f"reference dict key 'cluster_ids_list[0]' must be 3-D [B, H, S], got shape {list(ids0.shape)}")
    S = ids0.shape[2]
    for s in range(stages):
        _ref_check(f"cluster_ids_list[{s}]", _ref_tensor(packed, "cluster_ids_list", s), (torch.uint8,), (B, H, S))
    if D % block_size or block_size % (8 // bits):
        raise ValueError(f"block_size must divide head_dim {D} and be a multiple of {8 // bits}, got {block_size}")
    _ref_check("residual_quant", _ref_tensor(packed, "residual_quant"), (torch.uint8,), (B, H, S, D * bits // 8))
    scales = _ref_tensor(packed, "scales")
    _ref_check("scales", scales, (torch.float8_e4m3fn, torch.bfloat16), (B, H, S, D // block_size))
    zeros = packed.get("zeros")
    if zeros is not None:
        _ref_check("zeros", _ref_tensor(packed, "zeros"), (scales.dtype,), (B, H, S, D // block_size))

    def raw(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to("cpu").contiguous().view(torch.uint8).reshape(-1).clone()

    arrays = {}
    for s in range(stages):
        arrays[f"centroids.{s}"] = raw(packed["centroids_list"][s])
    for s in range(stages):
        arrays[f"ids.{s}"] = raw(packed["cluster_ids_list"][s])
    arrays["codes"] = raw(packed["residual_quant"])
    arrays["scales"] = raw(scales)
    if zeros is not None:
        arrays["zeros"] = raw(zeros)
    layout = {
        "dtype": _DTYPE_NAMES[c0.dtype], "shape": (B, S, H, D), "bits": bits, "block_size": block_size,
        "stages": stages, "centroids": K, "asymmetric": zeros is not None,
        "scale_dtype": "fp8_e4m3" if scales.dtype == torch.float8_e4m3fn else "bf16", "scaling": "compat",
    }
    return Encoding(layout, arrays)
