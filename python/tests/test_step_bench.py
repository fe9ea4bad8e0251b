"""The CPU rehearsal of the step benchmark (bench/step_bench.py, issue 37): the device
run's every code path at a tiny size — the engine's dense and packed caches loaded as on
the device (python/gpu/engineload.py: the four engine modules under stub packages), the
engine's packed cache with its codec (here quant-videogen under Triton's interpreter),
qvg's dense cache and both qvg packed configurations — with the device run's output
schema. It checks what a CPU run can: every configuration runs, qvg's dense cache
equals the engine's bit for bit inside the model, the deviations and resident bytes are
reported, and the JSON written is the document returned."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("step_bench", ROOT / "bench" / "step_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("triton")
    bench = _bench()
    out = tmp_path_factory.mktemp("step") / "step.json"
    doc = bench.main(["--device", "cpu", "--size", "tiny", "--out", str(out)])
    return bench, doc, json.loads(out.read_text())


def test_every_configuration_runs_with_the_device_runs_schema(run):
    bench, doc, written = run
    assert doc["complete"] and not doc["skipped"] and not doc["failed"], (doc["skipped"], doc["failed"])
    names = [c["name"] for c in doc["configs"]]
    assert names == list(bench.CONFIGS)
    keys = {"name", "cache", "codec", "time_per_chunk_s", "times_per_chunk_s", "cache_call_median_s", "cache_calls",
            "cache_time_per_chunk_s", "max_memory_allocated", "kv_resident_bytes", "latent_rel_l2_vs_dense",
            "time_ratio_vs_dense"}
    s = doc["shapes"]
    for c in written["configs"]:
        assert keys <= set(c), keys - set(c)
        assert c["max_memory_allocated"] is None  # a CPU run
        assert len(c["times_per_chunk_s"]) == s["chunks"] and all(t > 0 for t in c["times_per_chunk_s"])
        assert c["cache_calls"] == s["layers"] * s["chunks"] * (len(bench.DENOISING_TIMESTEPS) + 1)
        assert c["kv_resident_bytes"] > 0 and math.isfinite(c["latent_rel_l2_vs_dense"])
    assert written["device"] == "cpu" and written["model"].startswith("a stack of transformer blocks")
    assert "sglang" in json.dumps(written["configs"][0]["cache"])  # the engine's own class
    assert set(written) >= {"schema", "complete", "shapes", "bits", "engine_caches", "checks", "elapsed_s"}


def test_qvg_dense_equals_the_engines_dense_inside_the_model(run):
    _, doc, _ = run
    assert doc["checks"]["dense_qvg_equals_dense_engine"] is True
    by = {c["name"]: c for c in doc["configs"]}
    assert by["dense_qvg"]["latent_rel_l2_vs_dense"] == 0.0
    assert by["dense_qvg"]["kv_resident_bytes"] == by["dense_engine"]["kv_resident_bytes"]


def test_packed_caches_deviate_a_little_and_hold_less(run):
    _, doc, _ = run
    by = {c["name"]: c for c in doc["configs"]}
    dense = by["dense_engine"]["kv_resident_bytes"]
    for name in ("engine_packed", "qvg_engine", "qvg_recommended"):
        dev = by[name]["latent_rel_l2_vs_dense"]
        assert 0 < dev < 0.2, (name, dev)
        assert by[name]["kv_resident_bytes"] < dense, name
    assert "interpreter" in by["engine_packed"]["codec"]
    assert doc["checks"]["qvg_recommended_deviation_vs_engine_packed"] > 0
