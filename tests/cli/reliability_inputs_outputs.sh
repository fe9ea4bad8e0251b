#!/usr/bin/env bash
# Hostile inputs and failing outputs of the CLI (spec 5, 5.1; docs/reliability.md,
# "Reliability III: library and CLI"):
#  * `qvg encode --asymmetric` of values about 1e-44 writes a file it decodes
#    (the zero factor rounded to 0 and the writer stopped with an internal error);
#  * a sparse input of gigabytes with a zero header is refused at once with the
#    file's name, also under a memory limit (it read the whole file first: 2.2 GB, then
#    a bare std::bad_alloc); a valid header over more data than memory allows names
#    the file too;
#  * a failed write to standard output (/dev/full, a closed descriptor) is an
#    error: exit status 1, one line (memory, inspect, eval --json, encode's summary,
#    --help exited 0);
#  * real-valued flags follow the one rule of the settings: no hex floats,
#    no blanks, no '+' (`--scale 0x.8p1` and `--step-noise ' 0x1p-4'` were accepted).
# Usage: bash reliability_inputs_outputs.sh /path/to/qvg   (python3 standard library only)
set -euo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
# one_error NAME PATTERN -- command...: exit status 1, exactly one stderr line
# "qvg: error: ..." matching PATTERN (grep -E); stdout as the caller redirects it.
one_error() {
  local name=$1 pattern=$2 rc=0
  shift 3
  "$@" 2> "$T/stderr.txt" || rc=$?
  [ "$rc" -eq 1 ] || fail "$name: exit status $rc, expected 1; stderr: $(head -c 300 "$T/stderr.txt")"
  [ "$(wc -l < "$T/stderr.txt")" -eq 1 ] || fail "$name: stderr is not one line: $(head -c 300 "$T/stderr.txt")"
  grep -q "^qvg: error: " "$T/stderr.txt" || fail "$name: stderr: $(cat "$T/stderr.txt")"
  grep -Eq -- "$pattern" "$T/stderr.txt" || fail "$name: stderr does not match '$pattern': $(cat "$T/stderr.txt")"
}

QVG=${1:?usage: reliability_inputs_outputs.sh /path/to/qvg}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

# x.npy: float32 [16, 2, 64]; tiny.npy: the same shape, values k * 2^-149 (about 1e-44).
python3 - "$T" <<'PY'
import random, struct, sys
T = sys.argv[1]
random.seed(1)
def npy(path, vals, shape, raw=None):
    d = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % (shape,)
    d += " " * ((64 - (10 + len(d) + 1) % 64) % 64) + "\n"
    body = raw if raw is not None else struct.pack("<%df" % len(vals), *vals)
    open(path, "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode() + body)
npy(T + "/x.npy", [random.gauss(0, 1) for _ in range(16 * 2 * 64)], (16, 2, 64))
tiny = b"".join(struct.pack("<I", (1 + i % 7) | (0x80000000 if i % 3 == 0 else 0)) for i in range(16 * 2 * 64))
npy(T + "/tiny.npy", None, (16, 2, 64), raw=tiny)
# huge.npy: a valid header over 2^29 float32 (2 GiB) of data, the data a hole (below).
npy(T + "/huge.npy", None, (1, 2 ** 23, 1, 64), raw=b"")
PY
"$QVG" encode -i "$T/x.npy" -o "$T/good.qvgt" --centroids 8 > /dev/null

# ---- encoder output of values about 1e-44 ----
"$QVG" encode -i "$T/tiny.npy" -o "$T/tiny.qvgt" --asymmetric --centroids 4 > /dev/null ||
  fail "encode --asymmetric of values about 1e-44 failed"
"$QVG" decode -i "$T/tiny.qvgt" -o "$T/tiny_back.npy" > /dev/null || fail "decode of the tiny encoding failed"

# ---- sparse inputs with a zero header ----
for ext in npy safetensors qvgt; do
  truncate -s 2G "$T/sparse.$ext"
done
one_error "eval sparse .npy" "sparse\.npy.*magic" -- "$QVG" eval -i "$T/sparse.npy"
one_error "eval sparse .safetensors" "sparse\.safetensors" -- "$QVG" eval -i "$T/sparse.safetensors"
one_error "decode sparse .qvgt" "sparse\.qvgt" -- "$QVG" decode -i "$T/sparse.qvgt" -o "$T/none.npy"
one_error "inspect sparse .qvgt" "sparse\.qvgt" -- "$QVG" inspect "$T/sparse.qvgt"
# Under a memory limit of 1 GiB (address space): the same errors, no std::bad_alloc.
# (An AddressSanitizer build cannot start under such a limit: its shadow memory.)
if bash -c "ulimit -v 1048576; exec '$QVG' --version" > /dev/null 2>&1; then
  one_error "eval sparse .npy, 1 GiB" "sparse\.npy.*magic" -- bash -c "ulimit -v 1048576; exec '$QVG' eval -i '$T/sparse.npy'"
  one_error "decode sparse .qvgt, 1 GiB" "sparse\.qvgt" -- \
    bash -c "ulimit -v 1048576; exec '$QVG' decode -i '$T/sparse.qvgt' -o '$T/none.npy'"
  # A valid header over 2 GiB of data (a hole): more than the limit allows; the file is named.
  truncate -s $(( $(stat -c %s "$T/huge.npy") + (1 << 31) )) "$T/huge.npy"
  one_error "eval 2 GiB .npy, 1 GiB" "huge\.npy.*do not fit in memory" -- \
    bash -c "ulimit -v 1048576; exec '$QVG' eval -i '$T/huge.npy'"
else
  echo "reliability_inputs_outputs: this qvg does not start under ulimit -v (a sanitizer build?): the memory-limit checks skipped"
fi
[ ! -e "$T/none.npy" ] || fail "a refused input wrote an output"

# ---- failed writes to standard output ----
if [ -w /dev/full ]; then
  full_error() {  # full_error NAME -- command...: stdout to /dev/full
    local name=$1
    shift 2
    one_error "$name > /dev/full" "cannot write to standard output: No space left on device" -- "$@" > /dev/full
  }
  full_error "memory" -- "$QVG" memory --model self-forcing-1.3b
  full_error "memory --json" -- "$QVG" memory --model self-forcing-1.3b --json
  full_error "inspect" -- "$QVG" inspect "$T/good.qvgt"
  full_error "eval --json" -- "$QVG" eval -i "$T/x.npy" --centroids 8 --json
  full_error "encode's summary" -- "$QVG" encode -i "$T/x.npy" -o "$T/y.qvgt" --centroids 8
  full_error "--help" -- "$QVG" --help
  full_error "memory --help" -- "$QVG" memory --help
else
  echo "reliability_inputs_outputs: /dev/full not writable here: its checks skipped"
fi
one_error "memory, stdout closed" "cannot write to standard output" -- "$QVG" memory --model self-forcing-1.3b >&-
# And the same commands still exit 0 when stdout takes their output.
"$QVG" memory --model self-forcing-1.3b > "$T/memory.txt" || fail "memory to a file"
[ -s "$T/memory.txt" ] || fail "memory wrote nothing"

# ---- real-valued flags ----
for v in 0x.8p1 ' 0.5' '0.5 ' +0.5 0X1p-1 inf nan 1e400; do
  one_error "simulate --scale '$v'" "--scale must be a number, got '" -- \
    "$QVG" simulate --scale "$v" --chunks 1 --layers 1 > /dev/null
done
for v in ' 0x1p-4' 0x1p-4 '+0.05' '0.05x'; do
  one_error "simulate --step-noise '$v'" "--step-noise must be a number, got '" -- \
    "$QVG" simulate --step-noise "$v" --chunks 1 --layers 1 > /dev/null
done
one_error "compare --bpe-slack 0x1p1" "--bpe-slack must be a number" -- \
  "$QVG" compare --frontier --bpe-slack 0x1p1 > /dev/null
# The plain and exponent forms are accepted as before.
"$QVG" simulate --scale 5e-2 --step-noise 0.0 --chunks 1 --layers 1 > /dev/null 2>&1 || fail "--scale 5e-2 refused"
echo "reliability_inputs_outputs: OK"
