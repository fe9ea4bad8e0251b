#!/usr/bin/env bash
# qvg's int3 (a row of qvg/code_format.h) through the CLI end to end: `qvg encode
# --bits 3` (and `--bits int3`) -> .qvgt -> `qvg decode`, the error between those of
# int2 and int4 on the same tensor, `qvg eval --bits 3`, and a compare / simulate run
# at 3 bits. NEEDS the int3 encoders and decoders (src/kernels, src/codec, src/io's
# .qvgt version for int3): it fails on a build without them.
# Usage: bash int3_roundtrip.sh /path/to/qvg   (python3 standard library only)
set -euo pipefail
QVG=${1:?usage: int3_roundtrip.sh /path/to/qvg}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# x.npy: float32 [1, 48, 2, 64].
python3 - "$T/x.npy" <<'PY'
import random, struct, sys
random.seed(3)
S, H, D = 48, 2, 64
vals = [random.gauss(0, 1) for _ in range(S * H * D)]
d = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, %d, %d, %d), }" % (S, H, D)
d += " " * ((64 - (10 + len(d) + 1) % 64) % 64) + "\n"
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode()
                              + struct.pack("<%df" % len(vals), *vals))
PY
# rel_mse OUT REF: the relative squared error of one float32 .npy against another.
cat > "$T/rel.py" <<'PY'
import struct, sys
def read(p):
    b = open(p, "rb").read()
    n = struct.unpack("<H", b[8:10])[0]
    hdr = eval(b[10:10 + n].decode())
    assert hdr["descr"] == "<f4", hdr
    count = 1
    for s in hdr["shape"]: count *= s
    return struct.unpack("<%df" % count, b[10 + n:])
a, r = read(sys.argv[1]), read(sys.argv[2])
print("%.6g" % (sum((x - y) ** 2 for x, y in zip(a, r)) / sum(y * y for y in r)))
PY

flags=(--centroids 16 --block-size 32)
declare -A rel
for b in 2 3 4; do
  "$QVG" encode -i "$T/x.npy" -o "$T/x$b.qvgt" --bits "$b" "${flags[@]}" > /dev/null || fail "encode --bits $b"
  "$QVG" decode -i "$T/x$b.qvgt" -o "$T/y$b.npy" > /dev/null || fail "decode of --bits $b"
  rel[$b]=$(python3 "$T/rel.py" "$T/y$b.npy" "$T/x.npy")
done
python3 -c "import sys; a, b, c = map(float, sys.argv[1:]); sys.exit(0 if c < b < a and b < 0.1 else 1)" \
  "${rel[2]}" "${rel[3]}" "${rel[4]}" || fail "int3's error is not between int4's and int2's: ${rel[*]}"
# --bits int3 is the same encoding; the file names its width.
"$QVG" encode -i "$T/x.npy" -o "$T/m3.qvgt" --bits int3 "${flags[@]}" > /dev/null || fail "encode --bits int3"
cmp -s "$T/x3.qvgt" "$T/m3.qvgt" || fail "--bits int3 and --bits 3 differ"
"$QVG" inspect "$T/x3.qvgt" | grep -q "bits=3" || fail "inspect does not show bits=3"
"$QVG" eval -i "$T/x.npy" --bits 3 "${flags[@]}" --json > "$T/e.json" || fail "eval --bits 3"
python3 - "$T/e.json" "${rel[3]}" <<'PY' || fail "eval --bits 3 figures"
import json, sys
j = json.load(open(sys.argv[1]))
assert abs(j["rel_mse"] - float(sys.argv[2])) <= 1e-4 * float(sys.argv[2]) + 1e-12, (j["rel_mse"], sys.argv[2])
PY
# The workload commands at 3 bits.
tiny=(--model self-forcing-1.3b --scale 0.05 --layers 1)
"$QVG" compare "${tiny[@]}" --bits 3 --json > "$T/c3.json" || fail "compare --bits 3"
"$QVG" simulate "${tiny[@]}" --chunks 3 --bits 2,3 --json "$T/s.json" -q > /dev/null || fail "simulate --bits 2,3"
echo "int3_roundtrip: OK"
