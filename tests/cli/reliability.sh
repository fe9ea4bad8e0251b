#!/usr/bin/env bash
# CLI regressions (docs/reliability.md, findings 1, 2, 3, 4, 6, 8): hostile inputs and
# bad command lines end with exit status 1 and exactly one "qvg: error: ..." line on
# stderr, never a crash, a hang or a file written; --help and --version exit 0.
# Usage: bash reliability.sh /path/to/qvg   (python3 standard library only)
set -euo pipefail
QVG=${1:?usage: reliability.sh /path/to/qvg}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# x.npy: float32 [16, 2, 64]; deep.safetensors / deep_shape.safetensors: 100,000
# nested '[' in a __metadata__ value and in a shape element; deep.qvgt likewise.
python3 - "$T" <<'PY'
import json, random, struct, sys
T = sys.argv[1]
random.seed(1)
vals = [random.gauss(0, 1) for _ in range(16 * 2 * 64)]
d = "{'descr': '<f4', 'fortran_order': False, 'shape': (16, 2, 64), }"
d += " " * ((64 - (10 + len(d) + 1) % 64) % 64) + "\n"
open(T + "/x.npy", "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode()
                               + struct.pack("<%df" % len(vals), *vals))
deep = "[" * 100000
def st(path, header):
    h = header.encode()
    open(path, "wb").write(struct.pack("<Q", len(h)) + h)
st(T + "/deep.safetensors", '{"__metadata__":{"a":' + deep + '}}')
st(T + "/deep_shape.safetensors", '{"x":{"dtype":"F32","shape":[' + deep + '],"data_offsets":[0,0]}}')
st(T + "/deep.qvgt", '{"__metadata__":{"format":' + deep + '}}')
PY
"$QVG" encode -i "$T/x.npy" -o "$T/good.qvgt" --centroids 8 > /dev/null

# expect_error NAME OUTPUT PATTERN -- command...: exit status 1, OUTPUT not created,
# exactly one stderr line "qvg: error: ..." matching PATTERN (grep -E).
expect_error() {
  local name=$1 out=$2 pattern=$3
  shift 4
  rm -f "$out"
  local rc=0
  timeout 60 "$@" > "$T/stdout.txt" 2> "$T/stderr.txt" || rc=$?
  [ "$rc" -eq 1 ] || fail "$name: exit status $rc, expected 1; stderr: $(head -c 300 "$T/stderr.txt")"
  [ ! -e "$out" ] || fail "$name: wrote $out"
  [ "$(wc -l < "$T/stderr.txt")" -eq 1 ] || fail "$name: stderr is not one line: $(head -c 300 "$T/stderr.txt")"
  grep -q "^qvg: error: " "$T/stderr.txt" || fail "$name: stderr: $(cat "$T/stderr.txt")"
  grep -Eq -- "$pattern" "$T/stderr.txt" || fail "$name: stderr does not match '$pattern': $(cat "$T/stderr.txt")"
  # No absurd bound in a message (CLI11 printed a 309-digit one).
  ! grep -Eq '[0-9]{40}' "$T/stderr.txt" || fail "$name: absurd number in: $(cat "$T/stderr.txt")"
}

# Finding 1: deeply nested JSON, in every command that reads it.
expect_error "encode deep metadata" "$T/y.qvgt" "must be a string, got a JSON array" -- \
  "$QVG" encode -i "$T/deep.safetensors" -o "$T/y.qvgt"
expect_error "eval deep shape" "$T/none" "shape must hold non-negative integers, got a JSON array" -- \
  "$QVG" eval -i "$T/deep_shape.safetensors"
expect_error "decode deep .qvgt" "$T/y.npy" "invalid .qvgt file" -- "$QVG" decode -i "$T/deep.qvgt" -o "$T/y.npy"

# Finding 2: thread counts beyond the cap, everywhere threads are taken.
limit_re='must be in 0\.\.[0-9]+'
for n in 65536 32768 100000 -1 99999999999999999999999; do
  expect_error "decode --threads $n" "$T/y.npy" "--threads.*$limit_re|--threads must be" -- \
    "$QVG" decode -i "$T/good.qvgt" -o "$T/y.npy" --threads "$n"
  expect_error "eval --threads $n" "$T/none" "threads" -- "$QVG" eval -i "$T/x.npy" --threads "$n"
  expect_error "encode --threads $n" "$T/y.qvgt" "threads" -- "$QVG" encode -i "$T/x.npy" -o "$T/y.qvgt" --threads "$n"
  expect_error "bench --threads $n" "$T/none" "--threads" -- "$QVG" bench --quick --threads "$n"
done
"$QVG" decode -i "$T/good.qvgt" -o "$T/ok.npy" --threads 16 > /dev/null || fail "decode --threads 16 refused"

# Finding 3: a finite but huge scale factor is refused, nothing written.
python3 - "$T/good.qvgt" "$T/huge.qvgt" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
lo, hi = h["scale_factor"]["data_offsets"]
data = bytearray(b[8 + n:])
data[lo:lo + 4] = struct.pack("<f", 3e38)
open(sys.argv[2], "wb").write(b[:8 + n] + bytes(data))
PY
expect_error "decode huge scale_factor" "$T/y.npy" "keeps every decoded value finite" -- \
  "$QVG" decode -i "$T/huge.qvgt" -o "$T/y.npy"

# Finding 4: a FIFO as input is refused at once (it used to block forever in open()).
mkfifo "$T/fifo.qvgt" "$T/fifo.npy"
expect_error "decode FIFO" "$T/y.npy" "FIFO" -- "$QVG" decode -i "$T/fifo.qvgt" -o "$T/y.npy"
expect_error "encode FIFO" "$T/y.qvgt" "FIFO" -- "$QVG" encode -i "$T/fifo.npy" -o "$T/y.qvgt"

# Finding 6: every usage error exits 1 with one readable line.
expect_error "no subcommand" "$T/none" "a subcommand is required" -- "$QVG"
expect_error "unknown subcommand" "$T/none" "unknown subcommand 'frobnicate'" -- "$QVG" frobnicate
expect_error "unknown flag" "$T/y.qvgt" "--bitz" -- "$QVG" encode -i "$T/x.npy" -o "$T/y.qvgt" --bitz 4
expect_error "flag without value" "$T/y.qvgt" "--bits" -- "$QVG" encode -i "$T/x.npy" -o "$T/y.qvgt" --bits
expect_error "missing required flag" "$T/y.qvgt" "--output" -- "$QVG" encode -i "$T/x.npy"
expect_error "unknown root flag" "$T/none" "--frob" -- "$QVG" --frob
"$QVG" --help > /dev/null || fail "--help exit status $?"
"$QVG" --version | grep -q '^qvg ' || fail "--version"
"$QVG" decode --help > /dev/null || fail "decode --help exit status"

# Finding 8: stages above 64 are refused before any encoding, naming the field.
expect_error "encode --stages 65" "$T/y.qvgt" "stages must be in 1\.\.64, got 65" -- \
  "$QVG" encode -i "$T/x.npy" -o "$T/y.qvgt" --stages 65
expect_error "eval --stages 1000" "$T/none" "stages must be in 1\.\.64, got 1000" -- \
  "$QVG" eval -i "$T/x.npy" --stages 1000
echo "reliability: OK"
