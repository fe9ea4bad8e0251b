#!/usr/bin/env bash
# `qvg inspect` on both file kinds: a .qvgt written by `qvg encode` and the golden
# cache snapshot of the repository; a bit-flipped snapshot is reported (BAD section)
# without crashing and exits 1; truncated and foreign files exit 1 with one line.
# Usage: bash inspect.sh /path/to/qvg   (python3 standard library only)
set -euo pipefail
QVG=${1:?usage: inspect.sh /path/to/qvg}
HERE=$(cd "$(dirname "$0")" && pwd)
GOLDEN="$HERE/../data/golden_packed.qvgs"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

python3 - "$T/x.npy" <<'PY'
import random, struct, sys
random.seed(2)
vals = [random.gauss(0, 1) for _ in range(24 * 2 * 64)]
d = "{'descr': '<f4', 'fortran_order': False, 'shape': (24, 2, 64), }"
d += " " * ((64 - (10 + len(d) + 1) % 64) % 64) + "\n"
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode()
                              + struct.pack("<%df" % len(vals), *vals))
PY
"$QVG" encode -i "$T/x.npy" -o "$T/x.qvgt" --centroids 8 --bits 2 --block-size 32 > /dev/null

# .qvgt: kind, version, shape, config, arrays and sizes; no checksums in the format.
"$QVG" inspect "$T/x.qvgt" > "$T/out.txt" || fail "inspect .qvgt: exit $?"
for want in "qvg packed tensor (.qvgt), format qvg.prq/1" "f32 \[1, 24, 2, 64\]" "bits=2 block_size=32 stages=1 centroids=8" \
            "codes" "scale_factor" "checksums  none"; do
  grep -q "$want" "$T/out.txt" || fail "inspect .qvgt lacks '$want': $(cat "$T/out.txt")"
done
"$QVG" inspect --json "$T/x.qvgt" | python3 -c '
import json, os, sys
j = json.load(sys.stdin)
assert j["kind"] == "qvgt" and j["format"] == "qvg.prq/1", j
assert j["metadata"]["shape"] == [1, 24, 2, 64], j["metadata"]  # numbers as numbers
assert j["bytes"] == os.path.getsize(sys.argv[1]), j
assert j["encoded_bytes"] == sum(a["bytes"] for a in j["arrays"]) < j["bytes"], j
' "$T/x.qvgt" || fail "inspect --json .qvgt"

# Snapshot: kind, version, config, state, every section with its checksum status.
"$QVG" inspect "$GOLDEN" > "$T/out.txt" || fail "inspect snapshot: exit $?"
for want in "qvg cache snapshot, format 1.0, little-endian" "packed (saved from device cpu)" "cache_size=16" \
            "init=warm" "global_end=16" "segment 0" "warm_v" "checksums  ok: all"; do
  grep -q "$want" "$T/out.txt" || fail "inspect snapshot lacks '$want': $(cat "$T/out.txt")"
done
"$QVG" inspect --json "$GOLDEN" | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["kind"] == "snapshot" and j["format"] == "1.0" and j["checksums_ok"], j
assert all(s["checksum"] == "ok" for s in j["sections"]), j["sections"]
assert j["state"]["segments"] == sum(s["name"].startswith("segment") for s in j["sections"]), j
# Numbers and booleans as JSON numbers and booleans, names as strings.
assert j["config"]["cache_size"] == 16 and j["config"]["init"] == "warm", j["config"]
assert j["config"]["attention_window_size"] is None and j["config"]["allow_growth"] is False, j["config"]
assert all(not isinstance(v, str) or not v.lstrip("-").isdigit() for v in list(j["config"].values()) + list(j["state"].values())), j
' || fail "inspect --json snapshot"

# A flipped byte inside a segment: reported, not a crash; exit 1 naming the section.
python3 - "$GOLDEN" "$T/flip.qvgs" <<'PY'
import json, subprocess, sys
b = bytearray(open(sys.argv[1], "rb").read())
# The section table: 40-byte header, then 32-byte entries (kind, index, offset, length, xxh64).
import struct
n = struct.unpack_from("<I", b, 16)[0]
for i in range(n):
    kind, index, off, length, _ = struct.unpack_from("<IIQQQ", b, 40 + 32 * i)
    if kind == 5 and index == 1:
        b[off + length // 2] ^= 0x40
open(sys.argv[2], "wb").write(bytes(b))
PY
rc=0
"$QVG" inspect "$T/flip.qvgs" > "$T/out.txt" 2> "$T/err.txt" || rc=$?
[ "$rc" -eq 1 ] || fail "inspect of a corrupted snapshot: exit $rc"
grep -q "segment 1 .*BAD" "$T/out.txt" || fail "BAD section not shown: $(cat "$T/out.txt")"
grep -q "checksums  BAD: 1 of" "$T/out.txt" || fail "summary: $(cat "$T/out.txt")"
[ "$(wc -l < "$T/err.txt")" -eq 1 ] && grep -q "^qvg: error: .*fail their checksum (segment 1)" "$T/err.txt" \
  || fail "stderr: $(cat "$T/err.txt")"

# Truncated, foreign, missing: one error line, exit 1.
head -c 30 "$GOLDEN" > "$T/short.qvgs"
head -c 100 "$T/x.qvgt" > "$T/short.qvgt"
for f in "$T/short.qvgs" "$T/short.qvgt" "$T/x.npy" "$T/missing.qvgt" "$T"; do
  rc=0
  "$QVG" inspect "$f" > /dev/null 2> "$T/err.txt" || rc=$?
  [ "$rc" -eq 1 ] || fail "inspect $f: exit $rc"
  [ "$(wc -l < "$T/err.txt")" -eq 1 ] && grep -q "^qvg: error: " "$T/err.txt" || fail "inspect $f: $(cat "$T/err.txt")"
done
echo "inspect: OK"
