"""python/gpu/summary.py on crafted inputs: the verdict of a
scripts/gpu-check run is all_met only when every step exited 0 and every check
passed. Standard library only: no torch, no GPU (runs with --noconftest too)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SUMMARY = Path(__file__).resolve().parents[1] / "gpu" / "summary.py"


def load_summary():
    spec = importlib.util.spec_from_file_location("qvg_gpu_summary", SUMMARY)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


summary = load_summary()


def good_run(tmp_path: Path) -> tuple[Path, dict]:
    """The output folder and steps of a run where everything passed."""
    steps = {name: {"rc": 0, "seconds": 10.0} for name in summary.VERDICT_STEPS}
    steps["build"]["seconds"] = 90.0
    bench = {"copy_gbs": 4300.0, "results": [
        {"name": "decode longcat tensor int2 [1, 29640, 32, 128]", "ms": 0.5, "fraction": 0.8},
        {"name": "decode self-forcing chunk int2 [1, 4680, 12, 128]", "ms": 0.02, "fraction": 0.75},
        {"name": "encode longcat tensor int2 [1, 29640, 32, 128] (K=256, 2 iters)", "ms": 2.0},
        {"name": "k-means assignment [1, 29640, 32, 128] K=256", "ms": 0.3, "fraction": 0.4},
        {"name": "update() step, 7-chunk window, recommended, no refinement layer", "ms": 0.08, "fraction": 0.9},
        {"name": "update() step, 7-chunk window, recommended, 4 refinement layers", "ms": 0.1, "fraction": 1.1},
    ]}
    ref = {"results": [{"shape": "longcat tensor", "bits": 2, "reference_encode_ms": 2.8,
                        "reference_decode_ms": 0.9, "ours_encode_ms": None, "ours_decode_ms": None}],
           "complete": True}
    check = {"passed": True, "ratio": 0.99, "ratio_limit": 1.02, "max_ulp_ref_dict_decoded_by_qvg": 0,
             "max_ulp_qvg_dict_decoded_by_ref": 0}
    compat = {"ok": True, "complete": True, "results": {"int2": dict(check), "int4": dict(check)}}
    for name, doc in (("gpu-bench.json", bench), ("ref-bench.json", ref), ("compat-check.json", compat)):
        (tmp_path / name).write_text(json.dumps(doc))
    return tmp_path, steps


def verdict(out: Path, steps: dict) -> dict:
    return summary.summarize(str(out), steps)


def test_issue_41_targets_are_judged_beside_all_met(tmp_path):
    out, steps = good_run(tmp_path)
    v = verdict(out, steps)
    by = {t["target"].split(":")[1].strip().split(" ")[0]: t for t in v["targets"]}
    # good_run: encode 2.0 / 2.8 ms (0.71, not 2x), decodes 0.8 / 0.75 of copy, assignment 0.4,
    # no window decode and no kmeans++ row (not run): none met, all_met unaffected.
    assert len(v["targets"]) == 5 and v["targets_met"] is False and v["all_met"] is True
    assert by["encode"]["met"] is False and abs(by["encode"]["value"] - 2.0 / 2.8) < 1e-12
    assert [t["met"] for t in v["targets"][1:]] == [False, None, False, None]
    bench = json.loads((out / "gpu-bench.json").read_text())
    keep = [r for r in bench["results"] if not r["name"].startswith(("decode ", "k-means", "encode "))]
    bench["results"] = keep
    bench["results"] += [
        {"name": "decode longcat tensor int2 [1, 29640, 32, 128]", "ms": 0.3, "fraction": 0.9},
        {"name": "decode longcat tensor int4 [1, 29640, 32, 128]", "ms": 0.4, "fraction": 0.86},
        {"name": "decode self-forcing 7-chunk window int2 [1, 32760, 12, 128]", "ms": 0.1, "fraction": 0.81},
        {"name": "encode longcat tensor int2 [1, 29640, 32, 128] (K=256, 2 iters)", "ms": 1.4},
        {"name": "k-means assignment [1, 29640, 32, 128] K=256", "ms": 0.2, "fraction": 0.55},
        {"name": "kmeans++ init longcat tensor [1, 29640, 32, 128] (K=256, one stage)", "ms": 1.9, "fraction": 0.95},
    ]
    (out / "gpu-bench.json").write_text(json.dumps(bench))
    v = verdict(out, steps)
    assert v["targets_met"] is True and v["all_met"] is True, v["targets"]
    bench["results"][-1]["ms"] = 2.1  # kmeans++ over 2 ms
    (out / "gpu-bench.json").write_text(json.dumps(bench))
    v = verdict(out, steps)
    assert v["targets_met"] is False and [t["met"] for t in v["targets"]][-1] is False


def test_everything_passed_is_all_met(tmp_path):
    out, steps = good_run(tmp_path)
    v = verdict(out, steps)
    assert v["all_met"] is True, [a for a in v["acceptances"] if a["met"] is not True]


@pytest.mark.parametrize("step", sorted(summary.VERDICT_STEPS))
@pytest.mark.parametrize("rc", [1, 124, None])
def test_a_failed_timed_out_or_missing_step_is_not_all_met(tmp_path, step, rc):
    out, steps = good_run(tmp_path)
    if rc is None:
        del steps[step]
    else:
        steps[step]["rc"] = rc
    v = verdict(out, steps)
    assert v["all_met"] is False
    bad = [a for a in v["acceptances"] if a["met"] is not True]
    assert len(bad) >= 1 and any(a["acceptance"].startswith(f"step {step} ") for a in bad)


@pytest.mark.parametrize("field,value", [("passed", False), ("ratio", 1.05), ("max_ulp_ref_dict_decoded_by_qvg", 1),
                                         ("max_ulp_qvg_dict_decoded_by_ref", 3)])
def test_a_failed_conformance_check_is_not_all_met_even_with_its_step_at_0(tmp_path, field, value):
    out, steps = good_run(tmp_path)
    compat = json.loads((out / "compat-check.json").read_text())
    compat["results"]["int4"][field] = value
    (out / "compat-check.json").write_text(json.dumps(compat))
    v = verdict(out, steps)
    assert v["all_met"] is False
    assert [a["acceptance"] for a in v["acceptances"] if a["met"] is False][0].startswith("reference-codec checks at int4")


def test_an_incomplete_or_missing_conformance_file_is_not_all_met(tmp_path):
    out, steps = good_run(tmp_path)
    compat = json.loads((out / "compat-check.json").read_text())
    del compat["results"]["int4"]
    compat.update(ok=False, complete=False)
    (out / "compat-check.json").write_text(json.dumps(compat))
    assert verdict(out, steps)["all_met"] is False
    (out / "compat-check.json").unlink()
    v = verdict(out, steps)
    assert v["all_met"] is False and v["compat_check"] is None


def test_slow_figures_and_a_long_run_are_not_all_met(tmp_path):
    out, steps = good_run(tmp_path)
    bench = json.loads((out / "gpu-bench.json").read_text())
    bench["results"][1]["fraction"] = 0.69  # the small shape's decode
    (out / "gpu-bench.json").write_text(json.dumps(bench))
    assert verdict(out, steps)["all_met"] is False
    out, steps = good_run(tmp_path)
    steps["build"]["seconds"] = 200.0
    assert verdict(out, steps)["all_met"] is False


@pytest.mark.parametrize("row,fraction", [(4, 1.01), (5, 1.21)])
def test_an_update_step_slower_than_its_limit_is_not_all_met(tmp_path, row, fraction):
    out, steps = good_run(tmp_path)
    bench = json.loads((out / "gpu-bench.json").read_text())
    bench["results"][row]["fraction"] = fraction
    (out / "gpu-bench.json").write_text(json.dumps(bench))
    v = verdict(out, steps)
    assert v["all_met"] is False
    assert [a["acceptance"] for a in v["acceptances"] if a["met"] is False][0].startswith("update() step")


def test_garbage_inputs_give_a_verdict_not_a_crash(tmp_path):
    (tmp_path / "gpu-bench.json").write_text("{not json")
    (tmp_path / "ref-bench.json").write_text("[]")
    (tmp_path / "compat-check.json").write_text(json.dumps({"results": {"int2": 3}}))
    v = verdict(tmp_path, {})
    assert v["all_met"] is False and all(a["met"] is not True for a in v["acceptances"])


def test_main_reads_a_folder_of_step_records_and_writes_the_file(tmp_path):
    out, steps = good_run(tmp_path)
    d = tmp_path / "steps"
    d.mkdir()
    for name, rec in steps.items():
        (d / f"{name}.json").write_text(json.dumps(rec))
    assert summary.main([str(out), str(d)]) == 0
    written = json.loads((out / "gpu-check.json").read_text())
    assert written["all_met"] is True and set(written["steps"]) == set(steps)
    (d / "gpu_tests.json").write_text(json.dumps({"rc": 1, "seconds": 3.0}))
    summary.main([str(out), str(d)])
    assert json.loads((out / "gpu-check.json").read_text())["all_met"] is False
