"""qvg.torch's quantization settings: :class:`QVGKVQuantArgs` over the C++ settings
table (qvg/settings.h) and its conversion to ``qvg._C.QuantArgs``."""

from __future__ import annotations

from dataclasses import field, fields, make_dataclass
from typing import Any

from .. import _C

# ---------------------------------------------------------------------------
# Configuration (spec 2)
# ---------------------------------------------------------------------------

# The settings table (qvg/settings.h): (name, flag suffix, kind, per_role,
# default, allowed) per setting. QVGKVQuantArgs' fields are its shared settings, in its
# order, made from it below (a setting is a row of the C++ table, nothing here);
# per-role ones are the k_config / v_config texts.
_SETTINGS = [s for s in _C.quant_settings() if not s[3]]
_PY_TYPES = {"bits": "int | None", "int": "int", "width": "int", "bool": "bool", "name": "str", "real": "float",
             "seed": "int"}
# The fields of k_config / v_config: the per-role rows' flag suffixes ("_k_iters" -> iters).
_ROLE_FIELDS = ", ".join(flag[len("_k_"):] for name, flag, _kind, role, _d, _a in _C.quant_settings()
                         if role and name.startswith("k_"))


def _flag_text(value: Any) -> str:
    """A typed flag value (as argparse produces it) in the C++ parser's text form."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class _QuantArgsMethods:
    """The methods of :class:`QVGKVQuantArgs` (its fields come from the settings table)."""

    @property
    def enabled(self) -> bool:
        return self.bits is not None

    def validate(self) -> Any:
        """Raises ValueError naming the field, the value and what is allowed; returns self."""
        _quant_to_c(self).validate()
        return self

    def describe(self) -> str:
        return _quant_to_c(self).describe()

    @classmethod
    def from_dict(cls, kwargs: dict) -> Any:
        """Builds the settings from the engine's flat flags (``kv_cache_quant``: off, none,
        bf16, or a code width's mode: the engine's int2 and int4, qvg's int3;
        ``kv_cache_quant_centroids``, ``_block_size``, ``_stages``, ``_iters``,
        ``_keep_recent``, ``_sink_keep``, ``_asymmetric``, ``_sink``, ``_sink_span``,
        and qvg's ``_span_chunks``, ``_span_mode``, ``_span_break_ratio``, ``_refine_recent``, ``_refine_bits``,
        ``_scaling``, ``_scale_dtype``, ``_init``, ``_seed``, ``_scale_search``,
        ``_profile`` ("reference" | "hq" | "recommended", applied first: explicit flags override it;
        "recommended" also sets the cache policy: incremental spans of 4 chunks, keep_recent 0,
        4-bit refinement layers on the 4 newest encoded chunks, docs/quality.md) and
        the per-role ``_k_<f>`` / ``_v_<f>`` (f in bits, centroids, block_size, stages,
        iters, asymmetric, scale_dtype, scaling, scale_search)). Values may be typed (ints, bools) or strings; ``None`` means
        "not given". Without ``kv_cache_quant`` everything is default (off), as in
        the engine. A key starting with ``kv_cache_quant`` that names no setting is a
        ValueError naming the nearest known one (``kv_cache_quant_config``, the engine's
        own key, excepted); other keys are ignored. Raises ValueError on bad values."""
        if not isinstance(kwargs, dict):
            raise ValueError(f"kwargs must be a dict of the engine's flags (kv_cache_quant, ...), "
                             f"got {type(kwargs).__name__}")
        master = kwargs.get("kv_cache_quant")
        if master is None:
            return cls()
        flags = {"kv_cache_quant": str(master).strip().lower()}
        # Every key with the settings' prefix goes to the C++ parser (QuantArgs::from_flags,
        # the CLI's too), which reads the profile first (explicit flags override it) and
        # refuses a key naming no setting, naming the nearest one (a misspelt key such as
        # kv_cache_quant_centriods is never silently ignored); other keys are ignored.
        for flag, value in kwargs.items():
            if value is None or not isinstance(flag, str) or flag == "kv_cache_quant":
                continue
            if flag.startswith("kv_cache_quant"):
                flags[flag] = _flag_text(value)
        return cls(**_C.quant_args_from_flags(flags))


def _make_quant_args() -> type:
    rows = [(name, _PY_TYPES[kind], field(default=default)) for name, _f, kind, _r, default, _a in _SETTINGS]
    rows += [("k_config", "str", field(default="")), ("v_config", "str", field(default=""))]
    doc = ["PRQ K/V-cache quantization settings (spec 2); the engine's ``QVGKVQuantArgs``.", "",
           "``bits is None`` (the default) means quantization is off: every segment stays raw. Validation is",
           "qvg's C++ ``QuantArgs::validate``, so messages match the CLI's. Fields (the settings table,",
           "qvg/settings.h; docs/python.md), each with its default and what is allowed:", ""]
    doc += [f"* ``{name}`` = {default!r}: {allowed}" for name, _f, _k, _r, default, allowed in _SETTINGS]
    doc += [f"* ``k_config`` = '': K's own codec settings over the shared ones, \"field=value,...\" ({_ROLE_FIELDS})",
            "* ``v_config`` = '': V's own codec settings (as k_config)"]
    cls = make_dataclass("QVGKVQuantArgs", rows, bases=(_QuantArgsMethods,), namespace={"__doc__": "\n".join(doc)})
    cls.__module__ = "qvg.torch"
    return cls


QVGKVQuantArgs = _make_quant_args()


_QUANT_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(QVGKVQuantArgs)}
_KIND = {name: kind for name, _flag, kind, _role, _d, _a in _SETTINGS}
_ALLOWED = {name: allowed for name, _flag, _kind, _role, _d, allowed in _SETTINGS}
_INT_FIELDS = tuple(n for n, k in _KIND.items() if k in ("int", "width"))
_BOOL_FIELDS = tuple(n for n, k in _KIND.items() if k == "bool")
_STR_FIELDS = tuple(n for n, k in _KIND.items() if k == "name") + ("k_config", "v_config")
_FLOAT_FIELDS = tuple(n for n, k in _KIND.items() if k == "real")


# The fields of the engine's own QVGKVQuantArgs (SGLang): an object with all of them
# is accepted as the engine's settings (qvg's extensions take their defaults).
_ENGINE_FIELDS = tuple(_C.engine_quant_fields())


def _check_quant_args(q: Any, what: str = "quant_args") -> None:
    """Settings are a QVGKVQuantArgs, the engine's class (an object
    with its fields), or None; anything else (a dict of flags, "int2", 2) would
    silently turn quantization off, so it is refused naming the argument (spec 5.1,
    "Arguments at the Python boundary")."""
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
        raise ValueError(f"bits must be {_ALLOWED['bits']}, got {v['bits']!r}")
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


def as_quant_args(value: Any, what: str = "quant_args") -> Any:
    """The one way qvg takes K/V quantization settings from a caller (the engine
    drop-ins' ``install(quant_args=...)``, :class:`qvg.flashdreams.BlockKVCache`,
    :class:`qvg.vllm_omni.LingBotQVGCache`; docs/engines.md): ``None`` (no settings),
    a :class:`QVGKVQuantArgs`, the engine's settings object (an object with the fields
    of SGLang's ``QVGKVQuantArgs``; qvg's extensions it lacks take their defaults) or
    a dict of the engine's flat flags (:meth:`QVGKVQuantArgs.from_dict`). Returns
    ``None`` or a validated :class:`QVGKVQuantArgs` (a new one for the engine's object
    or a dict; equal settings compare equal); anything else, or settings that do not
    validate, is ValueError naming ``what``."""
    if value is None:
        return None
    if isinstance(value, dict):
        value = QVGKVQuantArgs.from_dict(value)
    _check_quant_args(value, what)
    if not isinstance(value, QVGKVQuantArgs):
        value = QVGKVQuantArgs(**{name: getattr(value, name, default) for name, default in _QUANT_DEFAULTS.items()})
    _quant_to_c(value, what).validate()
    return value
