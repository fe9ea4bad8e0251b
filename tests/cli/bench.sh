#!/usr/bin/env bash
# `qvg bench --quick`: the whole CPU suite runs to its end (the load check's copy
# included: it once read freed buffers and crashed), writes every row to the JSON,
# and the branch row (fork_packed_cache, issue 38) reports its time and memory
# against copying the raw segments alone, with 8 branches holding the encoded
# history once. Figures only as ratios between rows of one run (no absolute times).
# Usage: bash bench.sh /path/to/qvg   (python3 standard library only)
set -euo pipefail
QVG=${1:?usage: bench.sh /path/to/qvg}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

"$QVG" bench --quick --threads 1 --json "$T/b.json" > "$T/out.txt" 2> "$T/err.txt"
grep -q "fork_packed_cache" "$T/out.txt" || { echo "FAIL: no fork_packed_cache row in the table" >&2; exit 1; }

# Under AddressSanitizer the heap is not glibc's: the bytes a fork allocates are not
# measured there (the row says so by leaving them out); everywhere else they must be.
# (grep -c reads nm's whole output: grep -q would stop early, and pipefail would then
# report nm's SIGPIPE as a failed test.)
asan=0
if (($(nm "$QVG" 2>/dev/null | grep -c __asan_init || true) > 0)); then asan=1; fi

python3 - "$T/b.json" "$asan" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
asan = sys.argv[2] == "1"
rows = doc
for name in ("copy_bandwidth", "decode_int2", "encode_int2", "reconstruct_window_int2", "fork_packed_cache"):
    assert name in rows, f"row {name} missing: {sorted(rows)}"
f = rows["fork_packed_cache"]
raw = f["raw_bytes"]
assert raw > 0
# A fork allocates what copying its raw chunks allocates, plus its segment list.
if asan:
    assert "fork_allocated_bytes" not in f, f
else:
    assert raw <= f["fork_allocated_bytes"] <= 1.1 * raw, f
# 8 branches: the encoded history once, the raw part 8 times.
whole = f["resident_bytes"]
assert f["branches8_bytes"] == whole + 7 * raw, f
assert f["branches8_copies_bytes"] == 8 * whole, f
assert f["ratio_to_raw_copy"] > 0
print(f"fork: {f['ratio_to_raw_copy']:.2f}x the raw copy's time, "
      f"{f['fork_allocated_bytes'] / raw if not asan else float('nan'):.3f}x its bytes")
PY
