#!/usr/bin/env bash
# CLI (docs/quality.md): `qvg compare --frontier` writes frontier.json, frontier.svg
# (labelled axes, the Pareto set and the reference default marked) and summary.txt, with
# progress on stderr; `--profile` with explicit flags overriding it in any order;
# `--scale-search`; per-role settings in `qvg memory`. frontier.svg draws nothing
# outside its canvas (svg_fit.py, rendered by rsvg-convert).
# Usage: bash quality.sh /path/to/qvg   (python3 standard library, rsvg-convert)
set -euo pipefail
QVG=${1:?usage: quality.sh /path/to/qvg}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# A tiny frontier: the reduced knob set, one round, one layer, two chunks.
"$QVG" compare --frontier --frontier-quick --rounds 1 --scale 0.05 --layers 1 --context-chunks 2 \
  --query-stride 16 --threads 2 --report "$T/rep" > "$T/out.txt" 2> "$T/err.txt" ||
  fail "frontier failed: $(cat "$T/err.txt")"
grep -q "coordinate descent" "$T/err.txt" || fail "no progress on stderr"
grep -q "hq vs reference" "$T/out.txt" || fail "no summary: $(cat "$T/out.txt")"
for f in frontier.json frontier.svg summary.txt; do [ -s "$T/rep/$f" ] || fail "missing $f"; done
command -v rsvg-convert > /dev/null || fail "rsvg-convert is missing (librsvg2-bin: scripts/deps.sh installs it)"
python3 "$(dirname "$0")/svg_fit.py" "$T/rep/frontier.svg" > "$T/fit.txt" || fail "frontier.svg: $(cat "$T/fit.txt")"
python3 - "$T/rep/frontier.svg" "$T/rep/frontier.json" <<'PY' || fail "bad frontier report"
import json, sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()   # well-formed XML
ns = {"s": "http://www.w3.org/2000/svg"}
ids = {e.get("id"): e for e in root.iter() if e.get("id")}
assert "bits per element" in "".join(ids["x-label"].itertext())
assert "attention relative L2 error" in "".join(ids["y-label"].itertext())
pareto = ids["pareto"]
assert len([c for c in pareto.iter() if c.get("class") == "pareto-point"]) >= 2
assert "reference default" in "".join(ids["reference"].itertext())
assert "hq profile" in "".join(ids["hq"].itertext())
d = json.load(open(sys.argv[2]))
assert d["format"] == "qvg.frontier/1"
pts = d["points"]
ref = d["summary"]["reference"]
assert ref["label"] == "reference default" and ref["k"]["scaling"] == "compat" and ref["k"]["centroids"] == 128
assert sum(p["pareto"] for p in pts) >= 2
assert {p["method"] for p in pts} == {"qvg", "rtn", "kivi", "quarot"}
assert {p.get("bits") for p in pts if p["method"] != "qvg"} == {2, 3, 4}
for p in pts:
    if p["pareto"]:
        for o in pts:
            assert not (o["bits_per_element"] < p["bits_per_element"] and o["attention_rel_l2"] < p["attention_rel_l2"])
PY

# --profile: explicit flags override it, whatever the order.
python3 - "$T/x.npy" <<'PY'
import struct, sys, random
random.seed(3)
n = 1 * 64 * 2 * 64
hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 64, 2, 64), }"
hdr += " " * (118 - len(hdr)) + "\n"
with open(sys.argv[1], "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
    f.write(struct.pack("<%df" % n, *[random.gauss(0, 100) for _ in range(n)]))
PY
"$QVG" encode -i "$T/x.npy" -o "$T/a.qvgt" --centroids 16 --profile hq --bits 4 || fail "encode --profile hq --bits 4"
"$QVG" encode -i "$T/x.npy" -o "$T/b.qvgt" --bits 4 --centroids 16 --profile hq || fail "encode --bits 4 --profile hq"
cmp -s "$T/a.qvgt" "$T/b.qvgt" || fail "the order of --profile and explicit flags changed the output"
"$QVG" inspect "$T/a.qvgt" > "$T/i.txt" || fail "inspect"
grep -q "asymmetric" "$T/i.txt" || fail "hq's asymmetric residual not in the file: $(cat "$T/i.txt")"
"$QVG" encode -i "$T/x.npy" -o "$T/c.qvgt" --centroids 16 --bits 4 --asymmetric --scaling two_level \
  --scale-search mse || fail "encode --scale-search mse"
cmp -s "$T/a.qvgt" "$T/c.qvgt" || fail "--profile hq is not asymmetric + two_level + scale search mse"
"$QVG" encode -i "$T/x.npy" -o "$T/d.qvgt" --profile best 2> "$T/e.txt" && fail "an unknown profile was accepted"
grep -q "reference, hq" "$T/e.txt" || fail "the profile error does not list the profiles: $(cat "$T/e.txt")"

# qvg memory: per-role settings counted (V at 4 bits costs more than both at 2).
two=$("$QVG" memory --model self-forcing-1.3b --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["per_layer_packed_mib"])')
mixed=$("$QVG" memory --model self-forcing-1.3b --v-config bits=4 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["per_layer_packed_mib"])')
python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); assert b > a * 1.2, (a, b)" "$two" "$mixed" ||
  fail "memory --v-config bits=4 ($mixed MiB) is not larger than int2 ($two MiB)"
"$QVG" memory --model self-forcing-1.3b --k-config nope=1 2> "$T/e.txt" && fail "a bad --k-config was accepted"
grep -q "unknown field 'nope'" "$T/e.txt" || fail "bad --k-config message: $(cat "$T/e.txt")"
# --profile recommended sets the cache policy in memory and simulate; an
# explicit policy flag overrides it whatever the order; --engine-baseline adds the
# engine's default first and a side-by-side table.
pol() { "$QVG" memory --model lingbot-world-14b --json "$@" |
  python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["span_chunks"], d["span_mode"], d["keep_recent_chunks"], d["refine_recent"], d["refine_bits"])'; }
rec=$(pol --profile recommended)
[ "$rec" = "4 incremental 0 4 4" ] || fail "memory --profile recommended: policy '$rec'"
a=$(pol --keep-recent 1 --profile recommended)
b=$(pol --profile recommended --keep-recent 1)
[ "$a" = "4 incremental 1 4 4" ] && [ "$a" = "$b" ] || fail "--keep-recent does not override the profile: '$a' / '$b'"
[ "$(pol --profile hq)" = "1 deferred 1 0 4" ] || fail "memory --profile hq changed the policy: $(pol --profile hq)"
"$QVG" simulate --scale 0.05 --chunks 6 --layers 1 --context-frames 9 --profile recommended --engine-baseline \
  --quiet --json "$T/s.json" > "$T/s.txt" || fail "simulate --profile recommended --engine-baseline"
grep -q "side by side (against engine;" "$T/s.txt" || fail "no side-by-side table: $(cat "$T/s.txt")"
# The table: per configuration the full-size model-level peak ratio, the time per step
# and the attention error, each with its ratio to the engine's (the engine's own: 1.00x).
python3 - "$T/s.txt" "$T/s.json" <<'PY' || fail "side-by-side table: $(sed -n '/side by side/,$p' "$T/s.txt")"
import json, re, sys
t = open(sys.argv[1]).read()
s = json.load(open(sys.argv[2]))["summary"]
table = t[t.index("side by side (against engine;"):]
assert re.search(r"configuration +peak ratio +time per step +attention error", table), table
for i, row in enumerate(s):
    m = re.search(r"\n  %s +([0-9.]+)x \(([0-9.]+)x\) +([0-9.]+) ms +\(([0-9.]+)x\) +([0-9.]+)%% +\(([0-9.]+)x\)"
                  % re.escape(row["label"]), table)
    assert m, (row["label"], table)
    peak, peak_r, ms, ms_r, err, err_r = map(float, m.groups())
    e = s[0]
    assert abs(peak - row["full_size"]["model_ratio"]) < 0.006, (peak, row["full_size"])
    assert abs(peak_r - row["full_size"]["model_ratio"] / e["full_size"]["model_ratio"]) < 0.006
    assert abs(ms - 1e3 * row["step_s"]) < 0.006 and abs(ms_r - row["step_s"] / e["step_s"]) < 0.006
    assert abs(err - 100 * row["attention_rel_l2"]) < 0.006
    assert abs(err_r - row["attention_rel_l2"] / e["attention_rel_l2"]) < 0.006
    assert i > 0 or (peak_r, ms_r, err_r) == (1.0, 1.0, 1.0)
PY
python3 - "$T/s.json" <<'PY' || fail "simulate --engine-baseline configurations"
import json, sys
c = json.load(open(sys.argv[1]))["configs"]
assert [x["label"] for x in c] == ["engine", "recommended int2"], c
e, r = c
assert (e["centroids"], e["scaling"], e["span_chunks"], e["keep_recent_chunks"]) == (128, "compat", 1, 1), e
assert (r["span_mode"], r["span_chunks"], r["keep_recent_chunks"], r["refine_recent"]) == ("incremental", 4, 0, 4), r
assert (r["asymmetric"], r["kmeans_iters"], r["init"]) == (True, 2, "random"), r
assert (r["scale_search"], r["k_settings"], r["v_settings"]) == ("mse", "", "scale_search=off"), r
assert (e["scale_search"], e["k_settings"], e["v_settings"]) == ("off", "", ""), e
PY
echo "quality.sh: ok"
