"""QVGKVQuantArgs: the fields, defaults, flag names and errors of spec 2."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from conftest import chunk, make_packed
import qvg.torch as qt


def test_defaults_are_spec_2():
    q = qt.QVGKVQuantArgs()
    assert q.bits is None and not q.enabled
    assert dataclasses.asdict(q) == dict(
        bits=None, centroids=128, block_size=64, stages=1, kmeans_iters=2, asymmetric=False, keep_recent_chunks=1,
        sink=True, sink_span="chunk", sink_keep_chunks=0, span_chunks=1, scaling="two_level",
        scale_dtype="fp8_e4m3", init="random", seed=1234, span_mode="deferred", span_break_ratio=0.0,
        refine_recent=0, refine_bits=4, scale_search="off", k_config="", v_config="")
    assert q.validate() is q
    assert q.describe() == "kv_cache_quant=off"
    assert qt.QVGKVQuantArgs(bits=4).enabled
    assert qt.QVGKVQuantArgs(bits=2, block_size=32).describe().startswith("kv_cache_quant=int2 centroids=128 block_size=32")


@pytest.mark.parametrize("mode,bits", [("off", None), ("none", None), ("bf16", None), ("int4", 4), ("int2", 2),
                                       ("INT4", 4), (" int2 ", 2), ("None", None), ("int3", 3), ("INT3", 3)])
def test_from_dict_modes(mode, bits):
    q = qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": mode})
    assert q.bits == bits and q.enabled == (bits is not None)


def test_from_dict_reads_every_flag():
    q = qt.QVGKVQuantArgs.from_dict({
        "kv_cache_quant": "int2", "kv_cache_quant_centroids": 64, "kv_cache_quant_block_size": 32,
        "kv_cache_quant_stages": 2, "kv_cache_quant_iters": 5, "kv_cache_quant_keep_recent": 0,
        "kv_cache_quant_sink_keep": 1, "kv_cache_quant_asymmetric": True, "kv_cache_quant_sink": False,
        "kv_cache_quant_sink_span": "full", "kv_cache_quant_span_chunks": 3, "kv_cache_quant_scaling": "compat",
        "kv_cache_quant_scale_dtype": "bf16", "kv_cache_quant_init": "warm", "kv_cache_quant_seed": 7,
        "kv_cache_quant_span_mode": "incremental", "kv_cache_quant_span_break_ratio": 1.5,
        "kv_cache_quant_refine_recent": 3, "kv_cache_quant_refine_bits": "2",
        # not ours: ignored, as by the engine (argparse dicts carry every server flag)
        "kv_cache_quant_config": object(), "model_path": "x", "kv_cache_quant_typo": None,
    })
    assert dataclasses.asdict(q) == dict(
        bits=2, centroids=64, block_size=32, stages=2, kmeans_iters=5, asymmetric=True, keep_recent_chunks=0,
        sink=False, sink_span="full", sink_keep_chunks=1, span_chunks=3, scaling="compat", scale_dtype="bf16",
        init="warm", seed=7, span_mode="incremental", span_break_ratio=1.5, refine_recent=3, refine_bits=2,
        scale_search="off", k_config="", v_config="")


def test_int3_is_accepted_on_every_width_setting():
    """qvg's int3 (a row of qvg/code_format.h): the master flag, the per-role flags,
    refine_bits, the dataclass fields and k_config / v_config, all from the table."""
    q = qt.QVGKVQuantArgs.from_dict({
        "kv_cache_quant": "int3", "kv_cache_quant_k_bits": "int3", "kv_cache_quant_v_bits": 3,
        "kv_cache_quant_span_mode": "incremental", "kv_cache_quant_refine_recent": 2,
        "kv_cache_quant_refine_bits": 3})
    assert (q.bits, q.k_config, q.v_config, q.refine_bits) == (3, "bits=3", "bits=3", 3)
    assert q.describe().startswith("kv_cache_quant=int3 ")
    assert q.validate() is q
    kw = dict(bits=3, centroids=16, block_size=32, span_mode="incremental", refine_recent=1, refine_bits=3,
              k_config="bits=int3,asymmetric=true", v_config="bits=4")
    assert qt.QVGKVQuantArgs(**kw).validate() == qt.QVGKVQuantArgs(**kw)
    # The engine's widths keep their meaning.
    assert qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": "int2"}).bits == 2
    assert qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": "int4"}).bits == 4


def test_from_dict_defaults_and_strings():
    assert qt.QVGKVQuantArgs.from_dict({}) == qt.QVGKVQuantArgs()
    # Without the master flag everything is default (off), as in the engine.
    assert qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": None, "kv_cache_quant_centroids": 0}) == qt.QVGKVQuantArgs()
    # None means "flag not given"; strings as on a command line work too.
    q = qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": "int4", "kv_cache_quant_centroids": None,
                                     "kv_cache_quant_sink": "false", "kv_cache_quant_iters": "3"})
    assert (q.bits, q.centroids, q.sink, q.kmeans_iters) == (4, 128, False, 3)


@pytest.mark.parametrize("flags,message", [
    ({"kv_cache_quant": "int8"}, r"^kv_cache_quant must be one of off, none, bf16, int2, int3 or int4, got 'int8'$"),
    ({"kv_cache_quant": "3"}, r"^kv_cache_quant must be one of off, none, bf16, int2, int3 or int4, got '3'$"),
    ({"kv_cache_quant": "int3", "kv_cache_quant_block_size": 36},
     r"^block_size must be a multiple of 8 \(the 3-bit code group, so codes fill whole bytes\) at bits=3, got 36$"),
    ({"kv_cache_quant_k_bits": "int5"},
     r"^kv_cache_quant_k_bits must be 2, 3 or 4 \(or int2, int3 or int4\), got 'int5'$"),
    ({"kv_cache_quant_centroids": 0}, r"^centroids must be in 1\.\.256, got 0$"),
    ({"kv_cache_quant_centroids": 257}, r"^centroids must be in 1\.\.256, got 257$"),
    ({"kv_cache_quant_block_size": 0}, r"^block_size must be > 0, got 0$"),
    ({"kv_cache_quant_stages": 0}, r"^stages must be in 1\.\.64, got 0$"),
    ({"kv_cache_quant_iters": -1}, r"^kmeans_iters must be > 0, got -1$"),
    ({"kv_cache_quant_keep_recent": -1}, r"^keep_recent_chunks must be >= 0, got -1$"),
    ({"kv_cache_quant_sink_keep": -2}, r"^sink_keep_chunks must be >= 0, got -2$"),
    ({"kv_cache_quant_sink_span": "half"}, r"^sink_span must be one of chunk, full, got 'half'$"),
    ({"kv_cache_quant": "int2", "kv_cache_quant_block_size": 6},
     r"^block_size must be a multiple of 4 \(the 2-bit code group, so codes fill whole bytes\) at bits=2, got 6$"),
    ({"kv_cache_quant_span_chunks": 0}, r"^span_chunks must be >= 1, got 0$"),
    ({"kv_cache_quant_iters": "two"}, r"^kv_cache_quant_iters must be an integer, got 'two'$"),
    ({"kv_cache_quant_asymmetric": "maybe"}, r"^kv_cache_quant_asymmetric must be a boolean"),
    ({"kv_cache_quant_span_mode": "lazy"}, r"^span_mode must be one of deferred, incremental, got 'lazy'$"),
    ({"kv_cache_quant_span_break_ratio": -1}, r"^span_break_ratio must be in \[0, 1e6\] .*got -1$"),
    ({"kv_cache_quant_refine_recent": 2},
     r"^refine_recent must be 0 unless span_mode is incremental .*got refine_recent = 2 with span_mode = deferred$"),
    ({"kv_cache_quant_span_mode": "incremental", "kv_cache_quant_refine_recent": 1, "kv_cache_quant_refine_bits": 5},
     r"^refine_bits must be 2, 3 or 4, got 5$"),
    ({"kv_cache_quant_span_mode": "incremental", "kv_cache_quant_refine_recent": -1},
     r"^refine_recent must be in 0\.\.1000000 \(0 = no refinement\), got -1$"),
    # docs/reliability.md, finding 9: a negative seed is refused, not wrapped to 2^64 - 1
    ({"kv_cache_quant_seed": -1}, r"^kv_cache_quant_seed must be"),
])
def test_from_dict_errors(flags, message):
    with pytest.raises(ValueError, match=message):
        qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": "int4", **flags})


@pytest.mark.parametrize("fields,message", [
    (dict(bits=5), r"^bits must be 2, 3 or 4 \(or none to disable quantization\), got 5$"),
    (dict(bits="4"), r"^bits must be 2, 3 or 4 \(or none to disable quantization\), got '4'$"),
    (dict(bits=3, block_size=12), r"^block_size must be a multiple of 8 .* at bits=3, got 12$"),
    (dict(bits=4, k_config="bits=3,block_size=12"), r"^K settings \(k_bits=3 k_block_size=12\): block_size must be a "
                                                    r"multiple of 8 .* at bits=3, got 12$"),
    (dict(bits=4, centroids=0), r"^centroids must be in 1\.\.256, got 0$"),
    (dict(centroids=300), r"^centroids must be in 1\.\.256, got 300$"),
    (dict(bits=4, block_size=0), r"^block_size must be > 0, got 0$"),
    (dict(bits=4, stages=0), r"^stages must be in 1\.\.64, got 0$"),
    (dict(bits=4, kmeans_iters=0), r"^kmeans_iters must be > 0, got 0$"),
    (dict(keep_recent_chunks=-1), r"^keep_recent_chunks must be >= 0, got -1$"),
    (dict(sink_keep_chunks=-1), r"^sink_keep_chunks must be >= 0, got -1$"),
    (dict(sink_span="all"), r"^sink_span must be one of chunk, full, got 'all'$"),
    (dict(bits=4, block_size=3), r"^block_size must be a multiple of 2 .* at bits=4, got 3$"),
    (dict(span_chunks=0), r"^span_chunks must be >= 1, got 0$"),
    (dict(scaling="x"), r"^scaling must be one of two_level, compat, got 'x'$"),
    (dict(scale_dtype="fp16"), r"^scale_dtype must be one of fp8_e4m3 \(or fp8\), bf16, got 'fp16'$"),
    (dict(init="zeros"), r"^init must be one of random, kmeans\+\+, warm, got 'zeros'$"),
    (dict(centroids=1.5), r"^centroids must be an integer, got 1\.5$"),
    (dict(sink=1), r"^sink must be a boolean \(True/False\), got 1$"),
    (dict(span_mode="lazy"), r"^span_mode must be one of deferred, incremental, got 'lazy'$"),
    (dict(span_mode="incremental", span_break_ratio=-0.5), r"^span_break_ratio must be in \[0, 1e6\]"),
    (dict(span_break_ratio="2"), r"^span_break_ratio must be a number, got '2'$"),
    (dict(refine_recent=1), r"^refine_recent must be 0 unless span_mode is incremental"),
    (dict(span_mode="incremental", refine_recent=1, refine_bits=8), r"^refine_bits must be 2, 3 or 4, got 8$"),
    (dict(refine_recent="1"), r"^refine_recent must be an integer, got '1'$"),
    (dict(seed=-1), r"^seed must be in \[0, 2\^64\), got -1$"),
])
def test_validate_errors(fields, message):
    q = qt.QVGKVQuantArgs(**fields)
    with pytest.raises(ValueError, match=message):
        q.validate()


def test_block_size_must_divide_head_dim_when_the_cache_is_built():
    q = qt.QVGKVQuantArgs(bits=4, block_size=64)
    q.validate()  # fine on its own
    with pytest.raises(ValueError, match=r"^block_size must divide head_dim \(96\), got block_size=64$"):
        make_packed(1, 8, 1, 96, quant=q)
    make_packed(1, 8, 1, 96, quant=qt.QVGKVQuantArgs(block_size=64))  # quantization off: not checked


def test_engine_style_quant_args_object_is_accepted(gen):
    """The engine's own QVGKVQuantArgs (without qvg's extension fields) works too."""
    engine_like = SimpleNamespace(bits=4, centroids=4, block_size=8, stages=1, kmeans_iters=2, asymmetric=False,
                                  keep_recent_chunks=0, sink=True, sink_span="chunk", sink_keep_chunks=0)
    cache = make_packed(1, 16, 2, 8, quant=engine_like)
    assert cache.q is engine_like
    for c in range(0, 16, 4):
        x = chunk(gen, 1, 4, 2, 8)
        cache.update_and_get_attention_kv(key=x, value=x, current_chunk_start=c)
    assert sum(s["packed"] for s in cache._segments()) == 3


def test_one_version_from_cmake():
    """qvg.__version__ (generated from CMake's project(VERSION)) is the extension's (qvg::kVersion)."""
    import pathlib
    import re

    import qvg
    import qvg._C

    assert qvg.__version__ == qvg._C.__version__
    cmake = (pathlib.Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()
    declared = re.search(r"project\(qvg VERSION ([0-9.]+)", cmake).group(1)
    assert qvg.__version__ == declared


def test_from_dict_recommended_profile_sets_codec_and_policy():
    """kv_cache_quant_profile=recommended is hq's codec plus a cache policy;
    explicit flags override any of it; the engine's defaults are unchanged without it."""
    r = qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": "int2", "kv_cache_quant_profile": "recommended"})
    assert (r.bits, r.asymmetric, r.scaling, r.scale_search, r.centroids) == (2, True, "two_level", "mse", 128)
    assert (r.kmeans_iters, r.init) == (2, "random")
    assert (r.span_chunks, r.span_mode, r.keep_recent_chunks, r.sink_keep_chunks) == (4, "incremental", 0, 0)
    assert (r.refine_recent, r.refine_bits, r.span_break_ratio) == (4, 4, 0.0)
    assert (r.k_config, r.v_config) == ("", "scale_search=off")  # V's search off (docs/quality.md)
    o = qt.QVGKVQuantArgs.from_dict({"kv_cache_quant_keep_recent": 1, "kv_cache_quant_profile": "recommended",
                                     "kv_cache_quant": "int4", "kv_cache_quant_refine_recent": 0})
    assert (o.bits, o.keep_recent_chunks, o.refine_recent, o.span_mode) == (4, 1, 0, "incremental")
    d = qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": "int2"})
    assert (d.span_chunks, d.span_mode, d.keep_recent_chunks, d.refine_recent) == (1, "deferred", 1, 0)
    with pytest.raises(ValueError, match="reference, hq, recommended"):
        qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": "int2", "kv_cache_quant_profile": "recommend"})


def test_from_dict_profile_scale_search_and_per_role_keys():
    """kv_cache_quant_profile (explicit flags override it), _scale_search, _k_*/_v_*."""
    hq = qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": "int2", "kv_cache_quant_profile": "hq"})
    assert (hq.asymmetric, hq.scaling, hq.scale_search, hq.bits) == (True, "two_level", "mse", 2)
    q = qt.QVGKVQuantArgs.from_dict({"kv_cache_quant_profile": "hq", "kv_cache_quant": "int4",
                                     "kv_cache_quant_asymmetric": False})
    assert (q.bits, q.asymmetric, q.scale_search) == (4, False, "mse")
    ref = qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": "int2", "kv_cache_quant_profile": "reference"})
    assert (ref.scaling, ref.scale_search, ref.asymmetric) == ("compat", "off", False)
    r = qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": "int2", "kv_cache_quant_v_asymmetric": True,
                                     "kv_cache_quant_k_bits": 4})
    assert r.k_config == "bits=4" and r.v_config == "asymmetric=true"
    assert "k_bits=4" in r.validate().describe()
    with pytest.raises(ValueError, match="profile"):
        qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": "int2", "kv_cache_quant_profile": "best"})
    with pytest.raises(ValueError, match="kv_cache_quant_k_seed"):
        qt.QVGKVQuantArgs.from_dict({"kv_cache_quant": "int2", "kv_cache_quant_k_seed": 3})
