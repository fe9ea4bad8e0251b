#!/usr/bin/env bash
# CLI: `qvg bench --quick` (issue 39, item 7): the table and the JSON report the
# machine's load while the suite ran (copy spread and drift, the load average, a
# verdict and its reason; a WARNING line when busy), and the reconstruct_window row is
# labelled as the reconstruct_window_int2 measurement under a second name. No time is
# asserted.
# Usage: bash bench.sh /path/to/qvg   (python3 standard library only)
set -euo pipefail
QVG=${1:?usage: bench.sh /path/to/qvg}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$QVG" bench --quick --json "$T/b.json" > "$T/out.txt" 2> "$T/err.txt" || fail "bench failed: $(cat "$T/err.txt")"
grep -Eq "^machine load: copy spread [0-9.]+x, drift [0-9.]+x, load average ([0-9.]+|n/a) on [0-9]+ cores: (BUSY|quiet)$" \
  "$T/out.txt" || fail "no machine-load line: $(cat "$T/out.txt")"
grep -q "^reconstruct_window .*the row reconstruct_window_int2 under the name issue 5 gave it" "$T/out.txt" \
  || fail "the reconstruct_window row is not labelled: $(grep reconstruct "$T/out.txt")"
python3 - "$T/b.json" "$T/out.txt" <<'PY' || fail "bench JSON"
import json, sys
j = json.load(open(sys.argv[1]))
out = open(sys.argv[2]).read()
m = j["machine_load"]
assert set(m) == {"loaded", "copy_spread", "copy_drift", "load_average_1m", "cores", "reason"}, m
assert m["copy_spread"] >= 1 and m["copy_drift"] > 0 and m["cores"] >= 1, m
assert m["loaded"] == bool(m["reason"]), m
assert ("WARNING: this machine was busy during the run (" + m["reason"] + ")" in out) == m["loaded"], out
assert j["reconstruct_window"]["alias_of"] == "reconstruct_window_int2", j["reconstruct_window"]
assert "ratio_to_copy" in j["reconstruct_window_int2"] and "ratio_to_copy" not in j["reconstruct_window"]
PY
echo "bench.sh: OK"
