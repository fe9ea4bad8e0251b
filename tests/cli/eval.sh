#!/usr/bin/env bash
# CLI: `qvg eval` text and --json output, every method.
# Usage: bash eval.sh /path/to/qvg   (python3 standard library only, no numpy)
set -euo pipefail
QVG=${1:?usage: eval.sh /path/to/qvg}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

python3 - "$T/x.npy" <<'PY'
import random, struct, sys
random.seed(3)
S, H, D = 64, 2, 64
vals = [random.gauss(0, 1) + (8.0 if i % D == 9 else 0.0) for i in range(S * H * D)]
d = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, %d, %d, %d), }" % (S, H, D)
d += " " * ((64 - (10 + len(d) + 1) % 64) % 64) + "\n"
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode()
                              + struct.pack("<%df" % len(vals), *vals))
PY
# All zeros: rel_mse is 0 and the SNR infinite (null in JSON).
python3 - "$T/zero.npy" <<'PY'
import struct, sys
d = "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 1, 16), }"
d += " " * ((64 - (10 + len(d) + 1) % 64) % 64) + "\n"
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode() + bytes(4 * 64))
PY

flags=(--centroids 16 --block-size 32)

# Text output.
"$QVG" eval -i "$T/x.npy" "${flags[@]}" > "$T/text.txt"
for w in "bits per element" "compression" "relative MSE" "SNR" "encode / decode" "baseline rtn"; do
  grep -q "$w" "$T/text.txt" || fail "text output lacks '$w'"
done
# A float32 input stores float32 codebooks (spec 1.5): the ratio line says so, with the
# bits per element the same tensor takes in bf16 (fewer); a float16 input does not.
python3 - "$T/text.txt" <<'PY' || fail "float32 codebooks not stated: $(cat "$T/text.txt")"
import re, sys
t = open(sys.argv[1]).read()
bpe = float(re.search(r"bits per element +([0-9.]+)", t).group(1))
m = re.search(r"codebooks stored in float32, the input's dtype \(([0-9.]+) bits per element; in bf16 the same "
              r"tensor would take ([0-9.]+)\)", t)
assert m, t
assert abs(float(m.group(1)) - bpe) < 1e-4 and float(m.group(2)) < bpe, (bpe, m.groups())
PY
python3 - "$T/x16.npy" <<'PY'
import random, struct, sys
random.seed(3)
S, H, D = 64, 2, 64
vals = [random.gauss(0, 1) for i in range(S * H * D)]
d = "{'descr': '<f2', 'fortran_order': False, 'shape': (1, %d, %d, %d), }" % (S, H, D)
d += " " * ((64 - (10 + len(d) + 1) % 64) % 64) + "\n"
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode()
                              + struct.pack("<%de" % len(vals), *vals))
PY
"$QVG" eval -i "$T/x16.npy" "${flags[@]}" > "$T/text16.txt"
grep -q "codebooks stored" "$T/text16.txt" && fail "a float16 input's codebooks are 16-bit: no note expected"
"$QVG" encode -i "$T/x.npy" -o "$T/x.qvgt" "${flags[@]}" | grep -q "codebooks stored in float32" \
  || fail "encode does not say its float32 codebooks"

# JSON: one object with the agreed keys; figures consistent with each other.
check_json() {  # file method
  python3 -m json.tool "$1" > /dev/null || fail "$2: not JSON"
  python3 - "$1" "$2" <<'PY' || fail "$2: bad JSON figures"
import json, math, sys
j = json.load(open(sys.argv[1]))
method = sys.argv[2]
for k in ("bits_per_element", "compression_ratio", "rel_mse", "snr_db", "encode_s", "decode_s"):
    assert k in j, k
assert j["method"] == method
b = j["bits_per_element"]
assert b > 0 and abs(j["compression_ratio"] - 16 / b) < 1e-9 * j["compression_ratio"]
assert 0 <= j["rel_mse"] < 1, j["rel_mse"]
assert abs(j["snr_db"] + 10 * math.log10(j["rel_mse"])) < 1e-9
assert j["encode_s"] >= 0
assert (j["decode_s"] is None) == (method != "qvg"), j["decode_s"]
assert j["codebook_dtype"] == ("f32" if method == "qvg" else None), j["codebook_dtype"]
r = j["baselines"]["rtn"]
assert set(r) == {"bits_per_element", "rel_mse", "snr_db"}, r
assert r["bits_per_element"] == 4.5, r  # int4 codes + one bf16 scale (16 bits) per 32 channels
assert 0 < r["rel_mse"] < 0.1
PY
}
"$QVG" eval -i "$T/x.npy" "${flags[@]}" --json > "$T/qvg.json"
[ "$(wc -l < "$T/qvg.json")" -eq 1 ] || fail "--json printed more than one line"
check_json "$T/qvg.json" qvg
for m in rtn kivi quarot; do
  for role in key value; do
    "$QVG" eval -i "$T/x.npy" "${flags[@]}" --method "$m" --role "$role" --json > "$T/$m.json"
    check_json "$T/$m.json" "$m"
  done
done
# rtn as the method reports the same figures as the rtn baseline.
python3 - "$T/rtn.json" <<'PY' || fail "rtn method != rtn baseline"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["rel_mse"] == j["baselines"]["rtn"]["rel_mse"]
assert j["bits_per_element"] == j["baselines"]["rtn"]["bits_per_element"]
PY

# A zero tensor: exact, infinite SNR -> null.
"$QVG" eval -i "$T/zero.npy" --centroids 4 --block-size 16 --json > "$T/zero.json"
python3 - "$T/zero.json" <<'PY' || fail "zero tensor figures"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["rel_mse"] == 0 and j["snr_db"] is None, j
PY

# Bad method / role: one error line, non-zero exit.
for bad in "--method gptq" "--role query"; do
  # shellcheck disable=SC2086
  if "$QVG" eval -i "$T/x.npy" "${flags[@]}" $bad > "$T/o.txt" 2> "$T/e.txt"; then fail "accepted $bad"; fi
  [ "$(wc -l < "$T/e.txt")" -eq 1 ] || fail "$bad: stderr is not one line: $(cat "$T/e.txt")"
  grep -q "^qvg: error: " "$T/e.txt" || fail "$bad: $(cat "$T/e.txt")"
done

echo "eval: OK"
