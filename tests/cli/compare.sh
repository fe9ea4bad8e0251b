#!/usr/bin/env bash
# CLI: `qvg compare` on a tiny workload — one table with the four methods, --json
# with consistent figures, --bits 4, and errors (non-zero exit, one stderr line).
# Usage: bash compare.sh /path/to/qvg   (python3 standard library only)
set -euo pipefail
QVG=${1:?usage: compare.sh /path/to/qvg}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

tiny=(--scale 0.05 --centroids 16 --layers 1 --query-stride 4 --threads 2)

"$QVG" compare "${tiny[@]}" > "$T/out.txt" 2> "$T/err.txt" || fail "compare failed: $(cat "$T/err.txt")"
[ ! -s "$T/err.txt" ] || fail "stderr not empty: $(cat "$T/err.txt")"
for w in "bits/elem" "ratio" "K SNR" "V SNR" "attn error" "cosine" "context" "queries"; do
  grep -qF "$w" "$T/out.txt" || fail "table lacks '$w'"
done
for m in qvg rtn kivi quarot; do
  [ "$(grep -cE "^  $m +[0-9]" "$T/out.txt")" -eq 1 ] || fail "table lacks one row for $m: $(cat "$T/out.txt")"
done

check_json() {  # file bits
  python3 - "$1" "$2" <<'PY' || fail "bad JSON figures ($2 bits)"
import json, sys
d = json.load(open(sys.argv[1]))
bits = int(sys.argv[2])
assert d["format"] == "qvg.compare/1"
assert d["codec"]["bits"] == bits and d["codec"]["block_size"] == 64
rows = {r["method"]: r for r in d["rows"]}
assert list(rows) == ["qvg", "rtn", "kivi", "quarot"], list(rows)
for m, r in rows.items():
    assert abs(r["compression_ratio"] - 16 / r["bits_per_element"]) < 1e-9, r
    assert 0 <= r["attention_rel_l2"] < 1 and 0.5 < r["attention_cosine"] <= 1 + 1e-9, r
    assert r["k_snr_db"] is not None and r["v_snr_db"] is not None, r
assert rows["rtn"]["bits_per_element"] == bits + 0.25, rows["rtn"]   # one bf16 scale per 64 channels
assert rows["quarot"]["bits_per_element"] == bits + 0.25
assert rows["qvg"]["bits_per_element"] > bits
assert d["workload"]["context_tokens"] >= 64 * 16   # codebooks at most 0.25 bits per element
assert rows["qvg"]["k_snr_db"] > rows["rtn"]["k_snr_db"]
PY
}
"$QVG" compare "${tiny[@]}" --json > "$T/c2.json" || fail "--json failed"
check_json "$T/c2.json" 2
"$QVG" compare "${tiny[@]}" --bits 4 --json > "$T/c4.json" || fail "--bits 4 failed"
check_json "$T/c4.json" 4

expect_error() {  # name -- command...
  local name=$1
  shift 2
  if "$@" > "$T/stdout.txt" 2> "$T/stderr.txt"; then fail "$name: succeeded"; fi
  [ ! -s "$T/stdout.txt" ] || fail "$name: printed to stdout"
  [ "$(wc -l < "$T/stderr.txt")" -eq 1 ] || fail "$name: stderr not one line: $(cat "$T/stderr.txt")"
  grep -q "error" "$T/stderr.txt" || fail "$name: stderr: $(cat "$T/stderr.txt")"
}
expect_error bits5 -- "$QVG" compare "${tiny[@]}" --bits 5
expect_error bits8 -- "$QVG" compare "${tiny[@]}" --bits 8
expect_error scale0 -- "$QVG" compare "${tiny[@]}" --scale 0
expect_error model -- "$QVG" compare "${tiny[@]}" --model nope
expect_error context -- "$QVG" compare "${tiny[@]}" --context-chunks 0
expect_error layers -- "$QVG" compare "${tiny[@]}" --layers 9
expect_error block -- "$QVG" compare "${tiny[@]}" --block-size 48
expect_error stride -- "$QVG" compare "${tiny[@]}" --query-stride 0
expect_error unknown -- "$QVG" compare "${tiny[@]}" --frobnicate
echo "compare.sh: OK"
