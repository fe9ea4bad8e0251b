"""quant-videogen 0.1.0's quantizer and dequantizer on the CPU, under Triton's interpreter.

The reference codec is written for CUDA: its k-means wrappers assert CUDA tensors, its
packing kernel calls ``libdevice.round`` (an extern the interpreter does not run: it
returns None) and casts scales to ``tl.float8e4nv``, and its autotuners benchmark
configurations on a GPU. Triton 3.9's interpreter (``TRITON_INTERPRET=1``) runs the
kernels themselves with numpy; what it gets wrong or cannot do is mended here, outside
the reference's code, and nothing of its arithmetic is replaced:

* the package's modules are imported from their own source files, compiled with
  ``optimize=1`` so that the wrappers' ``assert x.is_cuda`` lines are dropped (the
  package ``__init__``, which needs loguru, and its timing decorator are skipped);
* each ``@triton.autotune`` kernel runs with one fixed configuration, the one with the
  largest tile (fewest interpreted programs; a tile changes nothing but the order of
  fp32 sums in the assignment's matrix product, as the autotuner's choice does on a
  GPU) — which also avoids
  Triton 3.9's refusal of autotune keys that are not kernel arguments;
* ``libdevice.round`` in ``real/quant_pack.py`` is CUDA's ``round()``: half away from
  zero, written with ``tl.floor``/``tl.ceil`` (``y - trunc(y)`` is exact in fp32);
* the interpreter's float conversions truncate or mis-round (fp32 -> bf16 truncates;
  fp32 -> fp8 e4m3 loses the carry into the exponent, e.g. 1.9453 -> 1.0, and does not
  saturate): conversions between fp32, fp16, bf16 and fp8 e4m3 are done by torch with
  round-to-nearest-even, fp8 saturating at +-448 first, as the GPU's
  ``cvt.rn(.satfinite)`` does.

Limit: the interpreter computes bf16 arithmetic on the raw 16-bit patterns (its bf16
tensors are numpy uint16), so the quantizer only runs correctly on **float32 input**;
``quantize`` refuses anything else. The dequantizer accepts the dicts of either dtype.
Speed (2-core machine): about 7 s to quantize a ``[1, 3, 1170, 128]`` tensor at 128
centroids, well under a second for the small shapes of the tests.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any, Callable, Iterator

_STATE: dict[str, Any] = {}


def _largest_tile(configs: list) -> Any:
    def size(c: Any) -> int:
        n = 1
        for v in c.kwargs.values():
            n *= int(v)
        return n

    return max(configs, key=size)


class _FixedConfig:
    """Stands in for a triton.autotune wrapper: launches the kernel with one config."""

    def __init__(self, fn: Any, configs: list, prune: Any) -> None:
        self.fn, self.configs, self.prune = fn, configs, prune

    def __getitem__(self, grid: Any) -> Callable:
        def launch(*args: Any, **kwargs: Any) -> Any:
            configs = self.configs
            if self.prune is not None:
                names = self.fn.arg_names if hasattr(self.fn, "arg_names") else []
                named = dict(zip(names, args)) | kwargs
                configs = self.prune(configs, named) or configs
            cfg = dict(_largest_tile(configs).kwargs)
            cfg.update(kwargs)
            return self.fn[grid](*args, **cfg)

        return launch


def _patch_interpreter_conversions() -> None:
    """Makes the mended conversions (installed by _mended_conversions)."""
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter as interp

    floats = (tl.float32, tl.float16, tl.bfloat16, tl.float8e4nv)

    def to_f32(data: Any, dt: Any) -> Any:
        if dt == tl.bfloat16:
            return (data.astype(np.uint32) << 16).view(np.float32)
        if dt == tl.float8e4nv:
            return torch.from_numpy(np.ascontiguousarray(data)).view(torch.float8_e4m3fn).float().numpy()
        return data.astype(np.float32)

    def from_f32(x: Any, dt: Any) -> Any:
        t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        if dt == tl.bfloat16:
            return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        if dt == tl.float16:
            return t.to(torch.float16).numpy()
        if dt == tl.float8e4nv:  # NaN stays NaN; finite values saturate like cvt.rn.satfinite
            return t.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        return t.numpy()

    builder = interp.InterpreterBuilder
    orig_cast, orig_fp = builder.cast_impl, builder.create_fp_to_fp

    def convert(src: Any, dst_type: Any) -> Any:
        s, d = src.dtype.scalar, dst_type.scalar
        if s in floats and d in floats and s != d:
            return interp.TensorHandle(from_f32(to_f32(src.data, s), d).reshape(src.data.shape), d)
        return None

    def cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
        out = convert(src, dst_type)
        return out if out is not None else orig_cast(self, src, dst_type)

    def create_fp_to_fp(self: Any, src: Any, dst_type: Any, rounding_mode: Any) -> Any:
        out = convert(src, dst_type)
        return out if out is not None else orig_fp(self, src, dst_type, rounding_mode)

    _STATE["mended"] = (cast_impl, create_fp_to_fp)


@contextlib.contextmanager
def _mended_conversions() -> Iterator[None]:
    """The interpreter's conversions mended while the reference runs, and only then (other
    users of the interpreter in the same process keep its own behaviour)."""
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    saved = builder.cast_impl, builder.create_fp_to_fp
    builder.cast_impl, builder.create_fp_to_fp = _STATE["mended"]
    swapped = _interpreted_stdlib() + _faster_interpreter(interp)
    try:
        yield
    finally:
        builder.cast_impl, builder.create_fp_to_fp = saved
        for mod, name, value in swapped:
            setattr(mod, name, value)


def _faster_interpreter(interp: Any) -> list[tuple[Any, str, Any]]:
    """Two of the interpreter's costs that compute nothing of the kernels' results,
    removed while the reference runs (about half of its time on the e2e suite's
    shapes); returns what to put back:

    * every call of a ``@triton.jit`` device function re-patches triton.language
      (``_patch_lang``: a walk of the modules' members, about 3 ms) and leaves it so:
      a launch patches the language modules its kernel names (``tl``), the first call
      of a standard-library function (``tl.zeros``, ``tl.max``, ...) patches
      ``tl.core`` too, and every later call walks both again to change nothing.
      Here a launch patches both modules once, restores both when it ends, and the
      device functions' calls inside it patch nothing;
    * the interpreter's options check every int32 add/sub/mul for overflow by
      redoing it in int64 (``sanitize_overflow``); a GPU build does that only in
      debug mode, and the reference's kernels run without it there.
    """
    import dataclasses
    import types as _types

    import triton.language as tl

    original = interp._patch_lang
    both = _types.SimpleNamespace(__globals__={"tl": tl, "core": tl.core})
    running: list[bool] = []  # whether a launch is running

    class _Scope:
        def __init__(self, scopes: list) -> None:
            self.scopes = scopes

        def restore(self) -> None:
            running.clear()
            for scope in reversed(self.scopes):
                scope.restore()

    def patch_lang(fn: Any) -> Any:
        if running:  # a device function's call inside the launch (the caller drops the scope)
            return None
        scopes = [original(fn), original(both)]
        running.append(True)
        return _Scope(scopes)

    builder = interp.interpreter_builder
    swapped = [(interp, "_patch_lang", original), (builder, "options", builder.options)]
    interp._patch_lang = patch_lang
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
    return swapped


def _interpreted_stdlib() -> list[tuple[Any, str, Any]]:
    """When triton.language was imported before TRITON_INTERPRET was set (by torch, or
    by another test), its @jit standard library (tl.zeros, tl.min, tl.argmin, ...) holds
    compiled-mode JITFunctions, which an interpreted kernel cannot call: swaps in
    interpreted ones; returns what to put back."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    mods = [m for m in (tl, getattr(tl, "standard", None), getattr(tl, "random", None)) if m is not None]
    made: dict[int, Any] = {}
    swapped = []
    for mod in mods:
        for name, value in list(vars(mod).items()):
            if isinstance(value, JITFunction) and not isinstance(value, InterpretedFunction):
                if id(value) not in made:
                    made[id(value)] = InterpretedFunction(value.fn)
                swapped.append((mod, name, value))
                setattr(mod, name, made[id(value)])
    return swapped


def _on_own_stack(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) with the mended interpreter, run on a worker thread of its own
    (the caller waits): for speed only. CPython 3.11 keeps frames in 16 KiB chunks that it
    maps when a call crosses into a new one and unmaps on return; the interpreter's
    millions of short calls, made from a caller whose stack ends near a chunk's end (as
    the e2e suite's rollouts under pytest do), mapped and unmapped a chunk per call
    (1.1 million mmap/munmap pairs, 2.5x the time). A thread's stack starts empty, so the
    depth is the same whoever calls."""
    import concurrent.futures

    pool = _STATE.get("pool")
    if pool is None:
        pool = _STATE["pool"] = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="qvg-reference")

    def run() -> Any:
        with _mended_conversions():
            return fn(*args, **kwargs)

    return pool.submit(run).result()


def _import_source(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    exec(compile(path.read_text(), str(path), "exec", optimize=1), mod.__dict__)  # asserts dropped
    return mod


def _ours(module: str) -> bool:
    return module == "quant_videogen" or module.startswith("quant_videogen.")


def package_root() -> Path | None:
    """The installed quant-videogen package's folder, or None; looked up on sys.path
    (another loader may have put a stand-in package without a spec in sys.modules)."""
    saved = {m: sys.modules.pop(m) for m in [m for m in sys.modules if _ours(m)]}
    try:
        spec = importlib.util.find_spec("quant_videogen")
    finally:
        sys.modules.update(saved)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def load() -> tuple[Callable, Callable, str]:
    """(triton_prq_quantize_tensor, triton_prq_dequantize_tensor, how), from the installed
    quant-videogen's source files, for CPU tensors. Sets ``TRITON_INTERPRET=1`` for the
    process (Triton reads it when a kernel is defined). Raises ImportError when
    quant-videogen is not installed."""
    if "fns" in _STATE:
        return _STATE["fns"]
    root = package_root()
    if root is None:
        raise ImportError("quant-videogen is not installed")
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton
    import triton.language as tl

    _patch_interpreter_conversions()
    # The modules are loaded under their own names and taken out of sys.modules again
    # afterwards (what was there before is put back): other loaders of the reference in
    # the same process (compat_common's) are not disturbed.
    saved = {m: sys.modules.pop(m) for m in [m for m in sys.modules if _ours(m)]}
    pkg = types.ModuleType("quant_videogen")
    pkg.__path__ = [str(root)]
    sys.modules["quant_videogen"] = pkg
    timer = types.ModuleType("quant_videogen.timer")
    timer.time_logging_decorator = lambda _name: (lambda f: f)  # type: ignore[attr-defined]
    sys.modules["quant_videogen.timer"] = timer
    for sub in ("kernels", "kernels.triton", "kmeans", "real", "sim", "sim.quant"):
        p = types.ModuleType(f"quant_videogen.{sub}")
        p.__path__ = [str(root.joinpath(*sub.split(".")))]
        sys.modules[f"quant_videogen.{sub}"] = p

    real_autotune = triton.autotune

    def autotune(configs: list, key: Any = None, prune_configs_by: Any = None, **_kw: Any) -> Callable:
        prune = (prune_configs_by or {}).get("early_config_prune")
        return lambda fn: _FixedConfig(fn, list(configs), prune)

    triton.autotune = autotune  # type: ignore[assignment]
    try:
        order = ["kmeans/euclid_assign", "kmeans/centroid_update", "kmeans/utils", "kmeans/kmeans_euclid",
                 "kernels/triton/permute", "real/smooth", "real/quant_pack", "real/accumulate", "real/prq",
                 "sim/quant/lowbit_quantize", "functions"]
        mods = {}
        for rel in order:
            path = root / f"{rel}.py"
            if path.exists():
                mods[rel] = _import_source("quant_videogen." + rel.replace("/", "."), path)
    finally:
        triton.autotune = real_autotune  # type: ignore[assignment]
        for m in [m for m in sys.modules if _ours(m)]:
            del sys.modules[m]
        sys.modules.update(saved)

    class _Libdevice:
        @staticmethod
        def round(y: Any) -> Any:  # CUDA round(): half away from zero
            t = tl.where(y >= 0, tl.floor(y), tl.ceil(y))
            return t + tl.where(tl.abs(y - t) >= 0.5, tl.where(y >= 0, 1.0, -1.0), 0.0)

    mods["real/quant_pack"].libdevice = _Libdevice
    functions = mods["functions"]
    quantize_fn, dequantize_fn = functions.triton_prq_quantize_tensor, functions.triton_prq_dequantize_tensor

    def quantize(x: torch.Tensor, **kwargs: Any) -> dict:
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise ValueError(f"the reference quantizer runs on the CPU for float32 CPU tensors only, got {x.dtype} "
                             f"on {x.device} (the interpreter's bf16 arithmetic works on raw bit patterns)")
        return _on_own_stack(quantize_fn, x, **kwargs)

    def dequantize(packed: dict, block_size: int, num_bits: int, output_dtype: Any = torch.bfloat16) -> Any:
        return _on_own_stack(dequantize_fn, packed, block_size, num_bits, output_dtype=output_dtype)

    how = (f"quant-videogen source files ({root}) under Triton {triton.__version__}'s interpreter: CUDA asserts "
           f"dropped, autotuners fixed to the largest tile, libdevice.round as CUDA round(), float conversions "
           f"RNE (fp8 saturating) by torch")
    _STATE["fns"] = (quantize, dequantize, how)
    return _STATE["fns"]
