"""Arguments at qvg.torch's Python boundary (spec 5.1): integers, tensors and the
engine's index tensors checked before any cache changes, each error naming its argument."""

from __future__ import annotations

from typing import Any

import torch

# ---------------------------------------------------------------------------
# Arguments at the Python boundary (spec 5.1)
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

    def allowed() -> str:  # built only for a refusal (this check runs on every update)
        return ("an integer" if lo == -(2**63) and hi == _I64_MAX else f"an integer in [{lo}, {hi}]") + (
            " (64-bit)" if lo == -(2**63) else "") + (" or None" if none else "")
    if isinstance(x, bool) or not isinstance(x, int):
        try:
            import numpy as np  # numpy integers are integers too
            if isinstance(x, np.integer):
                x = int(x)
            else:
                raise ValueError
        except (ImportError, ValueError):
            raise ValueError(f"{what} must be {allowed()}, got {type(x).__name__} {x!r:.60}") from None
    if not lo <= x <= hi:
        raise ValueError(f"{what} must be {allowed()}, got {x}")
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


class _IndexTensor:
    """A validated attribute: each assignment goes through :func:`_index_tensor`."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.slot = name, "_" + name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj, self.slot)

    def __set__(self, obj: Any, t: Any) -> None:
        setattr(obj, self.slot, _index_tensor(self.name, t, obj._device))


class _IntCursor:
    """A validated integer cursor (``global_end_index_int`` / ``local_end_index_int``):
    each assignment is None or an int in [0, 2^63 - 1] (numpy integers too), else
    ValueError naming the attribute (spec 5.1), so that a float, a
    string or an int past 64 bits never reaches the extension."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.slot = name, "_" + name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj, self.slot, None)

    def __set__(self, obj: Any, x: Any) -> None:
        setattr(obj, self.slot, _int_arg(self.name, x, lo=0, none=True))


class _IndexTensors:
    """The engine's index tensors and integer cursors, validated when set (at
    construction and after)."""

    _device: torch.device | None = None
    global_end_index = _IndexTensor()
    local_end_index = _IndexTensor()
    global_end_index_int = _IntCursor()
    local_end_index_int = _IntCursor()

    def _check_cursor_fits(self, end: int) -> None:
        """Before the cache changes: a cursor up to ``end`` must fit the index tensors
        (an int32 tensor holds at most 2^31 - 1), so cursors never change without the cache."""
        for what, t in (("global_end_index", self._global_end_index), ("local_end_index", self._local_end_index)):
            if t.dtype == torch.int32 and end > _I32_MAX:
                raise ValueError(f"{what} is an int32 tensor and cannot hold the cursor {end} this call would "
                                 f"set (at most 2^31 - 1); use torch.int64")
