"""The codec from Python (encode, decode) and interop with the reference codec
(quant-videogen; docs/compat.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import _C
from ._caches import _DTYPE_NAMES
from ._config import QVGKVQuantArgs, _quant_to_c


# ---------------------------------------------------------------------------
# The codec, and interop with the reference codec (quant-videogen; docs/compat.md)
# ---------------------------------------------------------------------------

_FROM_TEXT = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_SCALE_TORCH = {"fp8_e4m3": torch.float8_e4m3fn, "bf16": torch.bfloat16}
# The widths the reference codec has (the engine's rows of qvg/code_format.h); qvg's
# other widths (int3) have no layout there.
_REFERENCE_WIDTHS = tuple(_C.engine_code_widths())
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
    settings of ``quant`` (bits a width of qvg's code formats, 2, 3 or 4; centroids, block_size, stages, kmeans_iters,
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
    if lay["bits"] not in _REFERENCE_WIDTHS:
        raise ValueError(
            f"to_reference needs an encoding of a width the reference has ({', '.join(map(str, _REFERENCE_WIDTHS))} bits; "
            f"int{lay['bits']} is qvg's extension), got bits {lay['bits']}"
        )
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
