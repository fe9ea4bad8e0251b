#!/usr/bin/env bash
# CLI: `qvg simulate` on a tiny workload — the summary, progress lines on a non-TTY
# stderr, --json and --report (JSON valid against docs/simulate.schema.json with
# Debian's python3-jsonschema, the one schema check of the project: it also covers
# tests/test_simulate.cpp's configuration; SVGs parse as XML), several configurations,
# and errors (non-zero exit, one "qvg: error:" line on stderr, no file written).
# Usage: bash simulate.sh /path/to/qvg
set -euo pipefail
QVG=${1:?usage: simulate.sh /path/to/qvg}
HERE=$(cd "$(dirname "$0")" && pwd)
SCHEMA="$HERE/../../docs/simulate.schema.json"
PY=/usr/bin/python3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -f "$SCHEMA" ] || fail "schema not found: $SCHEMA"
"$PY" -c "import jsonschema" 2>/dev/null || fail "python3-jsonschema is missing (scripts/deps.sh installs it)"

# 1 head, 2 layers, 252-token chunks; a 5-chunk context; spans of 2 chunks.
tiny=(--scale 0.05 --context-frames 15 --span-chunks 2 --centroids 32 --query-stride 8 --threads 2)

validate() {  # file
  "$PY" - "$SCHEMA" "$1" <<'PY' || fail "$1 does not validate against the schema"
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
jsonschema.Draft202012Validator.check_schema(schema)
doc = json.load(open(sys.argv[2]))
jsonschema.Draft202012Validator(schema).validate(doc)
PY
}

# A run with --json and --report; progress goes to stderr as plain lines (not a TTY).
"$QVG" simulate "${tiny[@]}" --chunks 8 --json "$T/r.json" --report "$T/rep" > "$T/out.txt" 2> "$T/err.txt" \
  || fail "simulate failed: $(cat "$T/err.txt")"
for w in "what was simulated" "self-forcing-1.3b" "(a)" "memory" "the whole model (2 layers" "memory at its peak than with dense caches" \
         "one shared view window" "per denoising step" "bits per element" "quality" \
         "attention output" "K SNR" "time" "wall time" "How to read it" "report: $T/rep/report.json,"; do
  grep -qF "$w" "$T/out.txt" || fail "summary lacks '$w'"
done
[ "$(grep -c 'chunk [0-9]*/8 done' "$T/err.txt")" -eq 8 ] || fail "expected 8 progress lines: $(cat "$T/err.txt")"
grep -q $'\r' "$T/err.txt" && fail "carriage returns in non-TTY progress"
validate "$T/r.json"
for f in report.json memory.svg attention.svg summary.txt; do [ -s "$T/rep/$f" ] || fail "report lacks $f"; done
validate "$T/rep/report.json"
"$PY" -c 'import json,sys; assert len(json.load(open(sys.argv[1]))["chunks"]) == 8' "$T/r.json" \
  || fail "the JSON should hold 8 chunks"
"$PY" - "$T/rep" <<'PY' || fail "SVG check failed"
import sys, xml.etree.ElementTree as ET
ns = "{http://www.w3.org/2000/svg}"
for name, words in (("memory.svg", ["dense caches (bf16, 2 layers)", "packed int2: 2 layers' caches + one shared view",
                                     "not the model's peak", "MiB, all 2 layers", "window full", "numbered from 1"]),
                    ("attention.svg", ["int2", "attention relative error (%)", "first span encoded"])):
    root = ET.parse(f"{sys.argv[1]}/{name}").getroot()
    assert root.tag == ns + "svg", root.tag
    texts = " | ".join(t.text or "" for t in root.iter(ns + "text"))
    for w in words:
        assert w in texts, (name, w, texts)
    assert len([p for p in root.iter(ns + "path") if p.get("class") == "series"]) >= 2, name
PY
# The figures: memory model agreement, quality bounded, the summary consistent.
"$PY" - "$T/r.json" <<'PY' || fail "bad figures in the JSON"
import json, sys
d = json.load(open(sys.argv[1]))
s = d["summary"][0]
assert s["label"] == "int2" and s["memory_model_matches"] is True, s
assert d["run"]["window_full_chunk"] == 5, d["run"]
assert 0 < s["attention_rel_l2"] < 0.5 and s["attention_cosine"] > 0.9, s
assert s["ratio_peak"] > 1 and s["bits_per_element"] > 2, s
for c in d["chunks"]:
    p = c["packed"][0]
    assert p["resident_bytes"] == p["predicted_resident_bytes"], c["index"]
    if p["encoded_visible_tokens"] == 0:
        assert p["attention_rel_l2"] == 0 and p["k_snr_db"] is None, c["index"]
PY

# tests/test_simulate.cpp's tiny configuration (12 chunks, 64 centroids): its JSON
# validates too. And the schema is not vacuous: four violations, four errors.
lib=(--scale 0.05 --context-frames 15 --span-chunks 2 --centroids 64 --query-stride 8 --threads 2)
"$QVG" simulate "${lib[@]}" --chunks 12 -q --json "$T/lib.json" > /dev/null 2> "$T/err3.txt" \
  || fail "the library test's configuration failed: $(cat "$T/err3.txt")"
validate "$T/lib.json"
"$PY" - "$SCHEMA" "$T/lib.json" <<'PY' || fail "the schema does not catch violations"
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
doc = json.load(open(sys.argv[2]))
assert len(doc["chunks"]) == 12 and doc["configs"][0]["centroids"] == 64
del doc["run"]["steps"]                              # a required key missing
doc["chunks"][0]["packed"][0]["resident_bytes"] = -1  # below the minimum
doc["chunks"][1]["extra"] = 1                        # an unknown key
doc["configs"][0]["bits"] = 3                        # not in the enum
errors = list(jsonschema.Draft202012Validator(schema).iter_errors(doc))
assert len(errors) == 4, [e.message for e in errors]
PY

# Every chunk numbered from 1 wherever a person reads it: progress lines "chunk k/8"
# (the first 1), the charts' x values 1..8 (the memory chart's points, the attention
# chart's markers). Progress lines give every configuration's figures under its label.
head -1 "$T/err.txt" | grep -q "chunk 1/8 done.*dense .* MiB per layer; int2: packed .* MiB, attention error" \
  || fail "progress line: $(head -1 "$T/err.txt")"
"$PY" - "$T/rep" <<'PY' || fail "chart numbering"
import re, sys
for name in ("memory.svg", "attention.svg"):
    s = open(f"{sys.argv[1]}/{name}").read()
    ticks = [int(t) for t in re.findall(r'text-anchor="middle">(\d+)</text>', s)]
    assert ticks and min(ticks) >= 1 and max(ticks) == 8, (name, ticks)
PY

# Charts fit their canvas, with three configurations' long labels and headlines
# (rendered by rsvg-convert, svg_fit.py). And a run that encodes nothing says so.
command -v rsvg-convert > /dev/null || fail "rsvg-convert is missing (librsvg2-bin: scripts/deps.sh installs it)"
"$QVG" simulate --scale 0.05 --context-frames 15 --centroids 32 --query-stride 8 --threads 2 --chunks 1 --layers 1 --engine-baseline --profile recommended --bits 2,4 \
  -q --report "$T/three/" > "$T/three.txt" 2>&1 || fail "three configurations: $(cat "$T/three.txt")"
"$PY" "$HERE/svg_fit.py" "$T/three/memory.svg" "$T/three/attention.svg" "$T/rep/memory.svg" \
  "$T/rep/attention.svg" > "$T/fit.txt" || fail "charts: $(cat "$T/fit.txt")"
grep -qF "report: $T/three/report.json," "$T/three.txt" || fail "report path: $(grep report: "$T/three.txt")"
grep -q "nothing was encoded during this one chunk" "$T/three.txt" || fail "short run: $(cat "$T/three.txt")"
grep -q "memory at its peak than" "$T/three.txt" && fail "a run that encoded nothing claims a saving"
grep -q "nothing encoded yet" "$T/three/memory.svg" || fail "the memory chart claims a ratio before any encoding"

# --quiet: nothing on stderr. Several configurations: one entry each.
"$QVG" simulate "${tiny[@]}" --chunks 4 --bits 2,4 --layers 1 -q --json "$T/two.json" > /dev/null 2> "$T/err2.txt" \
  || fail "--bits 2,4 failed: $(cat "$T/err2.txt")"
[ ! -s "$T/err2.txt" ] || fail "--quiet printed: $(cat "$T/err2.txt")"
validate "$T/two.json"
"$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert [c["label"] for c in d["configs"]] == ["int2","int4"]; assert len(d["chunks"][0]["packed"]) == 2' "$T/two.json" \
  || fail "--bits 2,4 should give two configurations"

# Errors: non-zero exit, one line on stderr, no output file.
expect_error() {  # name -- command...
  local name=$1
  shift 2
  rm -rf "$T/e.json" "$T/erep"
  if "$@" > "$T/stdout.txt" 2> "$T/stderr.txt"; then fail "$name: succeeded"; fi
  [ ! -e "$T/e.json" ] || fail "$name: wrote the JSON"
  [ ! -e "$T/erep" ] || fail "$name: created the report directory"
  [ "$(wc -l < "$T/stderr.txt")" -eq 1 ] || fail "$name: stderr not one line: $(cat "$T/stderr.txt")"
  grep -q "error" "$T/stderr.txt" || fail "$name: stderr: $(cat "$T/stderr.txt")"
}
out=(--chunks 2 --json "$T/e.json" --report "$T/erep" -q)
expect_error scale0 -- "$QVG" simulate "${tiny[@]}" --scale 0 "${out[@]}"
expect_error scale2 -- "$QVG" simulate "${tiny[@]}" --scale 2 "${out[@]}"
expect_error scaleabc -- "$QVG" simulate "${tiny[@]}" --scale abc "${out[@]}"
expect_error chunks0 -- "$QVG" simulate "${tiny[@]}" --chunks 0 --json "$T/e.json" -q
expect_error twice -- "$QVG" simulate "${tiny[@]}" --chunks 2 --chunks 3 --json "$T/e.json" -q
expect_error steps0 -- "$QVG" simulate "${tiny[@]}" --steps 0 "${out[@]}"
expect_error bits5 -- "$QVG" simulate "${tiny[@]}" --bits 5 "${out[@]}"
expect_error bits22 -- "$QVG" simulate "${tiny[@]}" --bits 2,2 "${out[@]}"
expect_error model -- "$QVG" simulate "${tiny[@]}" --model nope "${out[@]}"
expect_error layers -- "$QVG" simulate "${tiny[@]}" --layers 3 "${out[@]}"
expect_error block -- "$QVG" simulate "${tiny[@]}" --block-size 48 "${out[@]}"
expect_error centroids -- "$QVG" simulate "${tiny[@]}" --centroids 300 "${out[@]}"
expect_error init -- "$QVG" simulate "${tiny[@]}" --init best "${out[@]}"
expect_error sinkspan -- "$QVG" simulate "${tiny[@]}" --sink-span half "${out[@]}"
expect_error noise -- "$QVG" simulate "${tiny[@]}" --step-noise 2 "${out[@]}"
expect_error jsondir -- "$QVG" simulate "${tiny[@]}" --chunks 2 --json "$T/no/such/dir/x.json" -q
expect_error unknown -- "$QVG" simulate "${tiny[@]}" --frobnicate "${out[@]}"
touch "$T/afile"
expect_error reportfile -- "$QVG" simulate "${tiny[@]}" --chunks 2 --report "$T/afile" -q
echo "simulate.sh: OK"
