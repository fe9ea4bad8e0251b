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
* :func:`as_quant_args` — settings from any form callers pass (None, a
  QVGKVQuantArgs, the engine's settings object, a dict of its flags), validated: the
  one way the engine drop-ins take them (docs/engines.md).

Switching is an import change::

    from qvg.torch import (CausalSelfAttentionKVCache, QVGKVQuantArgs,
                           QVGPackedCausalKVCache)

Scope and differences from the engine (all deliberate):

* CPU tensors, and CUDA tensors when the extension was built with its CUDA path
  (:data:`HAS_CUDA`; docs/python.md); dtype float32, bfloat16 or float16. Keys and
  values are read in place when contiguous ``[B, n, h, D]``; otherwise a
  contiguous copy is made, after every check of the call's shapes and dtypes (a
  call refused by its shapes takes no memory, whatever the tensors' strides). A cache lives on one device: the dense cache on its
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
  guard (a cache on ``cuda:1`` works while ``cuda:0`` is current); update() does not
  wait: the input values are checked on the device and a bad call is raised by the
  next call or ``check()``. A view is ready for work
  enqueued on that stream after the call; to read it on another stream, make that
  stream wait (``wait_stream``) and finish with it before the next call.
* Device memory comes from PyTorch's caching allocator: ``torch.cuda.memory_allocated()``
  counts ``resident_nbytes()`` plus ``view_buffer_nbytes()`` (each allocation rounded
  up to the allocator's 512-byte blocks) and ``torch.cuda.empty_cache()`` returns
  what was freed.
* Views are CUDA tensors with the lifetime rules above; a copied view owns its
  buffer; the packed current chunk's view is lent (a private copy if still alive at
  the next call).
* ``torch.compile``: a call is a graph break (the cache is opaque to dynamo);
  ``fullgraph=True`` fails. CUDA graph capture: steps that rewrite the current chunk
  with a view of the same size can be captured after a first eager update(); a first
  update, an advance, a view of another size and a dense growth raise
  NotImplementedError under a capture (docs/python.md).

Not thread-safe: one caller per cache at a time (a second thread gets RuntimeError).
"""

from __future__ import annotations

from dataclasses import fields  # noqa: F401  (qvg.torch.fields, as before the split)

from .._loader import check_build

check_build()  # ImportError naming both versions when _C was built for another torch
from .. import _C  # noqa: E402  (after the check: in another torch, loading it fails with a symbol error)
from ._caches import (  # noqa: E402
    HAS_CUDA,
    CausalAttentionKVView,
    CausalSelfAttentionKVCache,
    QVGPackedCausalKVCache,
)
from ._codec import Encoding, decode, encode, from_reference, to_reference  # noqa: E402
from ._config import QVGKVQuantArgs, _quant_to_c, as_quant_args  # noqa: E402,F401

__all__ = [
    "HAS_CUDA",
    "CausalAttentionKVView",
    "CausalSelfAttentionKVCache",
    "QVGKVQuantArgs",
    "QVGPackedCausalKVCache",
    "as_quant_args",
    "Encoding",
    "encode",
    "decode",
    "to_reference",
    "from_reference",
]
