#!/usr/bin/env bash
# CLI errors of encode / decode / eval: bad flag values, bad inputs and outputs exit
# non-zero with one "qvg: error: ..." line on stderr and write no output file (an
# existing output is left untouched).
# Usage: bash codec_errors.sh /path/to/qvg   (python3 standard library only)
set -euo pipefail
QVG=${1:?usage: codec_errors.sh /path/to/qvg}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

python3 - "$T/x.npy" <<'PY'
import random, struct, sys
random.seed(1)
vals = [random.gauss(0, 1) for _ in range(16 * 2 * 64)]
d = "{'descr': '<f4', 'fortran_order': False, 'shape': (16, 2, 64), }"
d += " " * ((64 - (10 + len(d) + 1) % 64) % 64) + "\n"
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode()
                              + struct.pack("<%df" % len(vals), *vals))
PY
"$QVG" encode -i "$T/x.npy" -o "$T/good.qvgt" --centroids 8 > /dev/null

# expect_error NAME OUTPUT [ONE_LINE] -- command...: non-zero exit, OUTPUT not created,
# and (ONE_LINE=1) exactly one stderr line starting "qvg: error: ".
expect_error() {
  local name=$1 out=$2 one=$3
  shift 4
  rm -f "$out"
  if "$@" > "$T/stdout.txt" 2> "$T/stderr.txt"; then fail "$name: succeeded"; fi
  [ ! -e "$out" ] || fail "$name: wrote $out"
  if [ "$one" = 1 ]; then
    [ "$(wc -l < "$T/stderr.txt")" -eq 1 ] || fail "$name: stderr not one line: $(cat "$T/stderr.txt")"
    grep -q "^qvg: error: " "$T/stderr.txt" || fail "$name: stderr: $(cat "$T/stderr.txt")"
  fi
  ls "$T" | grep -q '\.tmp\.' && fail "$name: left a temporary file" || true
}

# Bad codec flag values, for encode and eval.
bad_flags=(
  "--bits 5" "--bits 1" "--bits int5" "--bits 8" "--bits abc" "--bits 4.5" "--bits ''" "--centroids 0" "--centroids 257"
  "--centroids -1" "--block-size 48" "--block-size 3" "--block-size 0" "--block-size 128"
  "--stages 0" "--iters 0" "--iters 99999999999" "--scale-dtype fp16" "--scale-dtype FP8"
  "--scaling foo" "--init warm" "--init kmeans" "--seed -1" "--seed x" "--threads -1"
  "--bits 2 --block-size 2" "--bits 3 --block-size 4" "--bits int3 --block-size 12"
)
for f in "${bad_flags[@]}"; do
  eval "args=($f)"
  expect_error "encode $f" "$T/y.qvgt" 1 -- "$QVG" encode -i "$T/x.npy" -o "$T/y.qvgt" "${args[@]}"
  expect_error "eval $f" "$T/none" 1 -- "$QVG" eval -i "$T/x.npy" --json "${args[@]}"
done
# The messages name the flag or field and the value.
"$QVG" encode -i "$T/x.npy" -o "$T/y.qvgt" --block-size 48 2> "$T/e.txt" || true
grep -q "block_size" "$T/e.txt" && grep -q "48" "$T/e.txt" && grep -q "64" "$T/e.txt" \
  || fail "block-size message: $(cat "$T/e.txt")"
"$QVG" encode -i "$T/x.npy" -o "$T/y.qvgt" --scale-dtype fp16 2> "$T/e.txt" || true
grep -q -- "--scale-dtype" "$T/e.txt" && grep -q "fp16" "$T/e.txt" || fail "scale-dtype message: $(cat "$T/e.txt")"
# A width without a code format: the message lists the table's (qvg/code_format.h).
"$QVG" encode -i "$T/x.npy" -o "$T/y.qvgt" --bits 5 2> "$T/e.txt" || true
grep -q -- "--bits must be 2, 3 or 4" "$T/e.txt" && grep -q "'5'" "$T/e.txt" || fail "bits message: $(cat "$T/e.txt")"
# --init warm needs a cache: refused naming the flag.
"$QVG" encode -i "$T/x.npy" -o "$T/y.qvgt" --init warm 2> "$T/e.txt" || true
grep -q -- "--init must not be warm" "$T/e.txt" || fail "init message: $(cat "$T/e.txt")"

# An existing output is untouched by a failing encode.
cp "$T/good.qvgt" "$T/keep.qvgt"
if "$QVG" encode -i "$T/x.npy" -o "$T/keep.qvgt" --bits 5 2> /dev/null; then fail "bits 5 accepted"; fi
cmp -s "$T/good.qvgt" "$T/keep.qvgt" || fail "failing encode modified the existing output"

# Bad inputs and outputs.
printf 'not a tensor' > "$T/garbage.npy"
printf 'not a tensor' > "$T/garbage.safetensors"
head -c 100 "$T/good.qvgt" > "$T/trunc.qvgt"
expect_error "missing input" "$T/y.qvgt" 1 -- "$QVG" encode -i "$T/nope.npy" -o "$T/y.qvgt"
expect_error "garbage npy" "$T/y.qvgt" 1 -- "$QVG" encode -i "$T/garbage.npy" -o "$T/y.qvgt"
expect_error "garbage safetensors" "$T/y.qvgt" 1 -- "$QVG" encode -i "$T/garbage.safetensors" -o "$T/y.qvgt"
expect_error "unknown input ext" "$T/y.qvgt" 1 -- "$QVG" encode -i "$T/good.qvgt" -o "$T/y.qvgt"
expect_error "output not .qvgt" "$T/y.npy" 1 -- "$QVG" encode -i "$T/x.npy" -o "$T/y.npy"
expect_error "npy with --tensor" "$T/y.qvgt" 1 -- "$QVG" encode -i "$T/x.npy" --tensor k -o "$T/y.qvgt"
expect_error "output dir missing" "$T/d/y.qvgt" 1 -- "$QVG" encode -i "$T/x.npy" -o "$T/d/y.qvgt"
expect_error "decode truncated" "$T/y.npy" 1 -- "$QVG" decode -i "$T/trunc.qvgt" -o "$T/y.npy"
expect_error "decode garbage" "$T/y.npy" 1 -- "$QVG" decode -i "$T/garbage.npy" -o "$T/y.npy"
expect_error "decode missing" "$T/y.npy" 1 -- "$QVG" decode -i "$T/nope.qvgt" -o "$T/y.npy"
expect_error "decode bad ext" "$T/y.txt" 1 -- "$QVG" decode -i "$T/good.qvgt" -o "$T/y.txt"
expect_error "decode npy --tensor" "$T/y.npy" 1 -- "$QVG" decode -i "$T/good.qvgt" -o "$T/y.npy" --tensor k
expect_error "decode threads" "$T/y.npy" 1 -- "$QVG" decode -i "$T/good.qvgt" -o "$T/y.npy" --threads -2
expect_error "eval garbage" "$T/none" 1 -- "$QVG" eval -i "$T/garbage.npy"
grep -q "trunc.qvgt" <("$QVG" decode -i "$T/trunc.qvgt" -o "$T/y.npy" 2>&1) \
  || fail "decode error does not name the file"
# Command-line syntax errors (found by CLI11): one line too, nothing written.
expect_error "unknown flag" "$T/y.qvgt" 1 -- "$QVG" encode -i "$T/x.npy" -o "$T/y.qvgt" --bitz 4
expect_error "missing --output" "$T/y.qvgt" 1 -- "$QVG" encode -i "$T/x.npy"
expect_error "missing --input" "$T/y.npy" 1 -- "$QVG" decode -o "$T/y.npy"

# The good file still decodes.
"$QVG" decode -i "$T/good.qvgt" -o "$T/y.npy" > /dev/null || fail "good file did not decode"
echo "codec_errors: OK"
