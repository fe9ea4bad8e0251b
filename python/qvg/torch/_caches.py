"""The engine's cache classes over qvg's C++ caches: the view, the dense cache
(spec 3.2) and the packed cache (spec 4)."""

from __future__ import annotations

import errno
import functools
import os
import threading
from dataclasses import dataclass
from typing import Any

import torch

from .. import _C
from ._args import _IndexTensors, _int_arg, _tensor_arg
from ._config import QVGKVQuantArgs, _check_quant_args, _quant_to_c

#: True when the extension was built with its CUDA path (CUDA tensors supported).
HAS_CUDA: bool = bool(_C.HAS_CUDA)

_DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


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


def _one_caller(method: Any) -> Any:
    """Spec 5.1: one caller per cache. The Python side holds the dense cache's cursors
    and the index tensors, so a call that reads or writes them takes the cache's call
    lock without waiting: a second thread gets RuntimeError at once and changes nothing
    (the C++ caches guard their own state the same way)."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self._call_lock.acquire(blocking=False):
            raise RuntimeError("qvg cache is being used by another thread; a cache takes one caller at a time")
        try:
            return method(self, *args, **kwargs)
        finally:
            self._call_lock.release()

    return call


class _CacheInterface(_IndexTensors):
    """The engine's cache interface on top of a ``qvg._C`` cache (``self._c``):
    byte counts, direct attention, cursor reset and the update call. Subclasses
    implement ``_update(key, value, chunk_start, head_start, recent_window) -> qvg._C.View``
    and ``_set_cursors(global_end, local_end)``."""

    _c: Any  # the qvg._C cache

    def _update(self, key: torch.Tensor, value: torch.Tensor, chunk_start: int, head_start: int | None,
                recent_window: int | None) -> Any:
        raise NotImplementedError

    def _set_cursors(self, global_end: int, local_end: int) -> None:
        raise NotImplementedError

    # -- snapshots (docs/snapshot.md): load is each cache's, with its contract ----------
    @classmethod
    def _restored(cls, source: str | bytes, from_bytes: bool, what: str, kwargs: dict) -> Any:
        """A cache built from ``kwargs`` (completed from the snapshot where the class can:
        :meth:`_snapshot_kwargs`) whose state is then replaced by the snapshot's (on any
        error nothing is left: the new cache is dropped). A path that names no file is
        FileNotFoundError."""
        if not from_bytes and not os.path.exists(source):
            raise FileNotFoundError(errno.ENOENT, f"{cls.__name__}.{what}: no snapshot file at '{source}'", source)
        cache = cls(**cls._snapshot_kwargs(source, from_bytes, kwargs))
        cache._before_restore(what)
        cache._c.restore(source, from_bytes)
        cache._adopt_loaded_cursors()
        return cache

    @classmethod
    def from_snapshot_bytes(cls, data: bytes, **kwargs: Any) -> Any:
        """:meth:`load` from the bytes of a snapshot."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueError(f"data must be bytes, got {type(data).__name__}")
        return cls._restored(bytes(data), True, "from_snapshot_bytes", kwargs)

    @classmethod
    def _snapshot_kwargs(cls, source: str | bytes, from_bytes: bool, given: dict) -> dict:
        """The constructor's keyword arguments for a load: ``given`` as it is (the dense
        cache needs its buffers from the caller)."""
        return given

    def _before_restore(self, what: str) -> None:
        """What must hold before a restore (packed: a CPU cache)."""

    def _adopt_loaded_cursors(self) -> None:
        raise NotImplementedError

    def can_direct_current_attention(self, num_new_tokens: int) -> bool:
        return self._c.can_direct_current_attention(num_new_tokens)

    def resident_nbytes(self) -> int:
        """Bytes of the cache state: the dense cache's buffers (2 * B * cache_size * H * D
        * itemsize), or the packed cache's raw segments and encoded spans — those this
        cache alone holds when it shares encoded spans with its forks (:meth:`fork`)."""
        return self._c.resident_nbytes()

    def shared_nbytes(self) -> int:
        """(qvg extension) Bytes of the state this cache holds together with its forks or
        the cache it was forked from (the packed cache's encoded spans, codebooks and
        refinement layers, which branches share); 0 for a dense cache.
        ``resident_nbytes() + shared_nbytes()`` is the cache's whole state."""
        shared = getattr(self._c, "shared_nbytes", None)
        return shared() if shared is not None else 0

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

    @_one_caller
    def check(self) -> None:
        """(qvg extension) CUDA caches check each update's values (spec 1: finite, |x| <=
        1e16) on the device without waiting, and the next update raises a bad call's
        ValueError; ``check()`` waits for the current stream and raises it now (naming
        the bad call's chunk). A bad call's rows are never stored. CPU caches refuse a bad
        call at once: nothing to check."""
        check = getattr(self._c, "check", None)
        if check is not None:
            check()

    @_one_caller
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

    @_one_caller
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
        out = self._update(key, value, current_chunk_start, cache_head_start, recent_window_tokens)
        self._set_cursors(out.visible_global_end, out.visible_local_end)
        return CausalAttentionKVView(out.k, out.v, out.local_start_index, out.local_end_index, out.visible_local_end,
                                     out.visible_global_end, out.zero_copy)


# ---------------------------------------------------------------------------
# The dense cache (spec 3.2)
# ---------------------------------------------------------------------------


def _from_c(name: str, doc: str) -> property:
    """A read-only attribute forwarded to the C++ cache's ``name``."""
    return property(lambda self: getattr(self._c, name), doc=doc)


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
        self._call_lock = threading.Lock()
        sink_tokens = _int_arg("sink_tokens", sink_tokens)
        attention_window_size = _int_arg("attention_window_size", attention_window_size, none=True)
        cache_size = _int_arg("cache_size", cache_size)
        global_end_index_int = _int_arg("global_end_index_int", global_end_index_int, lo=0, none=True)
        local_end_index_int = _int_arg("local_end_index_int", local_end_index_int, lo=0, none=True)
        if global_sink_tokens:
            raise NotImplementedError(
                "CausalSelfAttentionKVCache: global_sink_tokens (the engine's pinned sink of longlive2) is not "
                f"supported by qvg, it must be 0, got {global_sink_tokens!r}"
            )
        window = None if not attention_window_size else attention_window_size
        self._window_arg = window  # as given (a fork passes it on: its snapshot's config is this one's)
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

    # -- the engine's fields (read from the C++ cache: .k/.v change on growth) ---------
    k = _from_c("k", "the key buffer [B, cache_size, H, D] (a new tensor after a growth)")
    v = _from_c("v", "the value buffer [B, cache_size, H, D]")
    cache_size = _from_c("cache_size", "tokens the buffers hold")
    sink_tokens = _from_c("sink_tokens", "leading tokens never evicted")
    attention_window_size = _from_c("attention_window_size", "tokens a view shows at most")
    allow_growth = _from_c("allow_growth", "whether the buffers grow")
    num_cache_heads = _from_c("num_heads", "heads the cache holds")

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
        """(global_end, local_end): the int cursors when set, else the index tensors'."""
        global_end, local_end = self.global_end_index_int, self.local_end_index_int
        if global_end is None or local_end is None:
            return int(self.global_end_index.item()), int(self.local_end_index.item())
        return global_end, local_end

    @_one_caller
    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the cache (configuration, cursors, the buffers, checksums) to ``path``
        atomically: a crash leaves the previous file. ValueError naming the path on an
        I/O error. A CUDA cache downloads its buffers (waiting for the current stream) and
        writes the bytes a CPU cache with the same history writes; each loads the other's."""
        self._c.save(os.fspath(path), *self._cursors())

    @_one_caller
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
        tensors) are set from the snapshot. With CUDA ``k``/``v`` the loaded buffers are
        CUDA tensors on their device (the upload is enqueued on the current stream)."""
        return cls._restored(os.fspath(path), False, "load", kwargs)

    def _adopt_loaded_cursors(self) -> None:
        global_end, local_end = self._c.global_end, self._c.local_end
        self.global_end_index.fill_(global_end)
        self.local_end_index.fill_(local_end)
        self.global_end_index_int = global_end
        self.local_end_index_int = local_end

    # -- branches (qvg extension; docs/python.md, "Branches") ---------------------------
    @_one_caller
    def fork(self) -> CausalSelfAttentionKVCache:
        """A new cache in this cache's state: a copy of the buffers (new tensors on the same
        device), new index tensors holding the cursors, the same int cursors (or none,
        as here) and options. Given the same calls both return what one cache that
        received the whole history returns. A CUDA cache's copies are enqueued on the
        current stream. The fork's buffers hold the current cache_size: after a growth its
        snapshot records that size as constructed (the state it loads is the same)."""
        global_end, local_end = self._cursors()
        # The window as given to this cache while it equals the buffer (it follows growth).
        window = self.attention_window_size
        if window == self.cache_size and self._window_arg is None:
            window = 0
        gi = self.global_end_index.clone().fill_(global_end)
        li = self.local_end_index.clone().fill_(local_end)
        ints = self.global_end_index_int is not None and self.local_end_index_int is not None
        return type(self)(self.k.clone(), self.v.clone(), gi, li,
                          global_end_index_int=global_end if ints else None,
                          local_end_index_int=local_end if ints else None,
                          sink_tokens=self.sink_tokens, attention_window_size=window,
                          allow_growth=self.allow_growth)

    # -- the interface (_CacheInterface) -----------------------------------------------
    def _update(self, key, value, chunk_start, head_start, recent_window):
        cursors = self._cursors()  # the Python side's cursors are the source of truth
        out = self._c.update(key, value, chunk_start, head_start, recent_window, *cursors)
        self._cursors_before = cursors
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
    one); the CUDA cache takes every setting the CPU cache takes (``init`` kmeans++
    included). ``quant_args``:
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
        self._call_lock = threading.Lock()
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
    @_one_caller
    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the cache (configuration, cursors, every segment as held in memory,
        warm-start codebooks, checksums) to ``path`` atomically: a crash leaves the
        previous file. ValueError naming the path on an I/O error; the cache is unchanged.
        A CUDA cache downloads its state (synchronizing the current stream) and writes
        the bytes a CPU cache with that state writes, with ``device`` cuda in the config;
        CPU and CUDA caches load each other's snapshots."""
        self._c.save(os.fspath(path))

    @_one_caller
    def snapshot_bytes(self) -> bytes:
        """The bytes :meth:`save` writes."""
        return self._c.snapshot_bytes()

    @classmethod
    def load(cls, path: str | os.PathLike[str], **kwargs: Any) -> QVGPackedCausalKVCache:
        """A cache restored from a snapshot written by :meth:`save`, as the C++
        ``PackedCausalCache::load(path)``: the snapshot holds the cache's whole
        configuration, so ``QVGPackedCausalKVCache.load(path)`` needs nothing else (a
        CPU cache with new cursor tensors, ``torch.zeros(1, dtype=torch.long)``).
        ``kwargs`` (the constructor's) are an optional expectation: each one given must
        match the snapshot (``batch_size``, ``cache_size``, ``num_heads``, ``head_dim``,
        ``dtype``, ``sink_tokens``, ``attention_window_size``, ``head_offset``,
        ``quant_args``; else ValueError naming the first differing field), and the
        runtime ones are taken as given (``device``, ``global_end_index`` /
        ``local_end_index``, ``use_int_indices``). A path that names no file is
        FileNotFoundError; a truncated or altered file is ValueError naming the section
        (spec 5: corrupt data); a dense cache's snapshot is ValueError. The cursors are set
        from the snapshot. Every later call returns what the saved cache would have
        returned, bit for bit (a CUDA cache loading a CPU snapshot: the same stored data,
        its later encodings the device encoder's). ``device`` may differ from the saved
        cache's; a CUDA device needs the CUDA path and the device (else the constructor's
        NotImplementedError or RuntimeError, before the payload is read)."""
        return cls._restored(os.fspath(path), False, "load", kwargs)

    @classmethod
    def _snapshot_kwargs(cls, source: str | bytes, from_bytes: bool, given: dict) -> dict:
        """The snapshot's own configuration (its config section: _C.packed_snapshot_settings)
        under what ``given`` sets: a CPU cache with new index tensors unless given."""
        options, settings = _C.packed_snapshot_settings(source, from_bytes)
        dtypes = {name: dtype for dtype, name in _DTYPE_NAMES.items()}
        if options["dtype"] not in dtypes:
            raise ValueError(f"snapshot: dtype must be one of f32, bf16, f16, got '{options['dtype']}'")
        kwargs: dict[str, Any] = dict(options, dtype=dtypes[options["dtype"]], device="cpu",
                                      global_end_index=torch.zeros(1, dtype=torch.long),
                                      local_end_index=torch.zeros(1, dtype=torch.long),
                                      quant_args=QVGKVQuantArgs(**settings))
        kwargs.update(given)
        return kwargs

    def _adopt_loaded_cursors(self) -> None:
        self._set_cursors(self._c.global_end, self._c.local_end)

    # -- branches (qvg extension; docs/python.md, "Branches") ---------------------------
    @_one_caller
    def fork(self) -> QVGPackedCausalKVCache:
        """A branch: a new cache with this cache's settings and state (qvg/cache.h,
        "Branches"). It shares this cache's encoded history — spans, codebooks,
        refinement layers, immutable and freed with the last branch holding them — and
        copies only its raw chunks (the current one, those kept raw), so a fork costs
        about a copy of the raw part and N branches hold the encoded history once
        (:meth:`resident_nbytes` counts what a branch alone holds, :meth:`shared_nbytes`
        the rest). Its index tensors are new (clones holding the cursors), its int
        cursors as this cache's. Given the same calls, every branch returns what one
        cache that received its whole history returns, bit for bit; branches may be
        used from two threads at once (each one caller at a time). A CUDA cache's raw
        copies are enqueued on the current stream; use every branch on the stream the
        cache's calls use (or synchronize before switching)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new._call_lock = threading.Lock()
        new._c = self._c.fork()
        new.global_end_index = self.global_end_index.clone()
        new.local_end_index = self.local_end_index.clone()
        return new

    # -- the interface (_CacheInterface) -----------------------------------------------
    def _update(self, key, value, chunk_start, head_start, recent_window):
        return self._c.update(key, value, chunk_start, head_start, recent_window)

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
        return self._c.segments()
