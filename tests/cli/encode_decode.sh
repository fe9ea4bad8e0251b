#!/usr/bin/env bash
# CLI end to end: tensor files -> `qvg encode` -> .qvgt -> `qvg decode` -> compare.
# Usage: bash encode_decode.sh /path/to/qvg
# Inputs are written with python3's standard library only (numpy is not required).
set -euo pipefail
QVG=${1:?usage: encode_decode.sh /path/to/qvg}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# x32.npy: float32 [S=48, H=2, D=64] (rank 3 -> B = 1); x16.npy: float16 [1, 48, 2, 64];
# kv.safetensors: "k" bf16 [1, 48, 2, 64] and "v" f32 [48, 2, 64].
python3 - "$T" <<'PY'
import math, random, struct, sys, json
T = sys.argv[1]
random.seed(5)
S, H, D = 48, 2, 64
vals = [random.gauss(0, 1) * 2 + (12.0 if i % D == 5 else 0.0) for i in range(S * H * D)]
def npy(path, shape, descr, data):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, ", ".join(map(str, shape)))
    total = 10 + len(d) + 1
    d += " " * ((64 - total % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode() + data)
npy(T + "/x32.npy", (S, H, D), "<f4", struct.pack("<%df" % len(vals), *vals))
npy(T + "/x16.npy", (1, S, H, D), "<f2", struct.pack("<%de" % len(vals), *vals))
def bf16(x):  # round to nearest even
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
kb = struct.pack("<%dH" % len(vals), *[bf16(v) for v in vals])
vb = struct.pack("<%df" % len(vals), *vals)
hdr = {"k": {"dtype": "BF16", "shape": [1, S, H, D], "data_offsets": [0, len(kb)]},
       "v": {"dtype": "F32", "shape": [S, H, D], "data_offsets": [len(kb), len(kb) + len(vb)]}}
h = json.dumps(hdr, separators=(",", ":")).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(T + "/kv.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + kb + vb)
PY

# Reads a .npy or .safetensors tensor and prints: dtype shape rel_mse-vs-reference bf16_exact
cat > "$T/check.py" <<'PY'
import json, struct, sys
def read(path, name=None):
    b = open(path, "rb").read()
    if path.endswith(".npy"):
        assert b[:6] == b"\x93NUMPY", "bad magic"
        n = struct.unpack("<H", b[8:10])[0]
        hdr = eval(b[10:10 + n].decode())
        assert not hdr["fortran_order"]
        data = b[10 + n:]
        descr, shape = hdr["descr"], list(hdr["shape"])
    else:
        n = struct.unpack("<Q", b[:8])[0]
        hdr = json.loads(b[8:8 + n])
        hdr.pop("__metadata__", None)
        if name is None:
            assert len(hdr) == 1, hdr.keys()
            name = next(iter(hdr))
        e = hdr[name]
        lo, hi = e["data_offsets"]
        data = b[8 + n + lo:8 + n + hi]
        descr, shape = e["dtype"], e["shape"]
    count = 1
    for s in shape: count *= s
    if descr in ("<f4", "F32"): v = struct.unpack("<%df" % count, data); raw = struct.unpack("<%dI" % count, data)
    elif descr in ("<f2", "F16"): v = struct.unpack("<%de" % count, data); raw = None
    elif descr == "BF16":
        h = struct.unpack("<%dH" % count, data)
        raw = [x << 16 for x in h]
        v = [struct.unpack("<f", struct.pack("<I", x))[0] for x in raw]
    else: raise SystemExit("unexpected dtype " + descr)
    return descr, shape, v, raw
out, ref = sys.argv[1], sys.argv[2]
name = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None
ref_name = sys.argv[4] if len(sys.argv) > 4 else "k"
d, shape, v, raw = read(out, name)
_, _, r, _ = read(ref, ref_name if ref.endswith(".safetensors") else None)
err = sum((a - b) ** 2 for a, b in zip(v, r)); tot = sum(a * a for a in r)
exact = raw is not None and all((x & 0xFFFF) == 0 for x in raw)
print(d, "x".join(map(str, shape)), "%.6g" % (err / tot), "bf16exact" if exact else "-")
PY
check() { python3 "$T/check.py" "$@"; }

flags=(--bits 4 --centroids 16 --block-size 32 --iters 3)

# float32 .npy, rank 3: decode gives float32 [1, S, H, D] close to the input.
"$QVG" encode -i "$T/x32.npy" -o "$T/x32.qvgt" "${flags[@]}" > "$T/out.txt"
grep -q "bits/element" "$T/out.txt" || fail "encode printed no summary"
"$QVG" decode -i "$T/x32.qvgt" -o "$T/y32.npy" > /dev/null
read -r dt shape rel _ < <(check "$T/y32.npy" "$T/x32.npy")
[ "$dt" = "<f4" ] || fail "f32 input decoded as $dt"
[ "$shape" = "1x48x2x64" ] || fail "decoded shape $shape"
python3 -c "import sys; sys.exit(0 if float('$rel') < 0.05 else 1)" || fail "rel mse $rel too large"

# The .qvgt is a safetensors file with the metadata of spec 1.6.
python3 - "$T/x32.qvgt" <<'PY' || fail ".qvgt metadata"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
m = h["__metadata__"]
want = {"format": "qvg.prq/1", "dtype": "f32", "shape": "[1,48,2,64]", "layout": "BSHD", "bits": "4",
        "block_size": "32", "stages": "1", "centroids": "16", "asymmetric": "false",
        "scale_dtype": "fp8_e4m3", "scaling": "two_level"}
assert m == want, m
assert sorted(k for k in h if k != "__metadata__") == ["centroids.0", "codes", "ids.0", "scale_factor", "scales"], h.keys()
assert h["codes"]["shape"] == [1, 2, 48, 32] and h["scales"]["dtype"] == "F8_E4M3"
PY

# Same bytes whatever the thread count.
"$QVG" encode -i "$T/x32.npy" -o "$T/t1.qvgt" "${flags[@]}" --threads 1 > /dev/null
"$QVG" encode -i "$T/x32.npy" -o "$T/t2.qvgt" "${flags[@]}" --threads 2 > /dev/null
cmp -s "$T/t1.qvgt" "$T/t2.qvgt" || fail "thread count changed the encoding"
cmp -s "$T/t1.qvgt" "$T/x32.qvgt" || fail "default threads changed the encoding"

# float16 .npy stays float16; other configurations round trip too.
for cfg in "--bits 2 --block-size 16" "--asymmetric --scale-dtype bf16" "--scaling compat --stages 2" \
           "--init kmeans++ --seed 7 --scale-dtype fp8"; do
  # shellcheck disable=SC2086
  "$QVG" encode -i "$T/x16.npy" -o "$T/x16.qvgt" --centroids 16 $cfg > /dev/null || fail "encode $cfg"
  "$QVG" decode -i "$T/x16.qvgt" -o "$T/y16.npy" > /dev/null || fail "decode $cfg"
  read -r dt shape rel _ < <(check "$T/y16.npy" "$T/x16.npy")
  [ "$dt" = "<f2" ] || fail "f16 input decoded as $dt ($cfg)"
  [ "$shape" = "1x48x2x64" ] || fail "decoded shape $shape ($cfg)"
  python3 -c "import sys; sys.exit(0 if float('$rel') < 0.5 else 1)" || fail "rel mse $rel ($cfg)"
done

# bf16 safetensors with two tensors: --tensor picks one; without it, the names are listed.
if "$QVG" encode -i "$T/kv.safetensors" -o "$T/k.qvgt" "${flags[@]}" 2> "$T/err.txt"; then
  fail "encode of a two-tensor file without --tensor succeeded"
fi
grep -q "'k'" "$T/err.txt" && grep -q "'v'" "$T/err.txt" || fail "error does not list the tensor names"
[ ! -e "$T/k.qvgt" ] || fail "failed encode wrote its output"
"$QVG" encode -i "$T/kv.safetensors" --tensor k -o "$T/k.qvgt" "${flags[@]}" > /dev/null
# .npy cannot hold bf16: float32 holding exactly bf16 values.
"$QVG" decode -i "$T/k.qvgt" -o "$T/k.npy" > /dev/null
read -r dt shape rel exact < <(check "$T/k.npy" "$T/kv.safetensors")
[ "$dt" = "<f4" ] && [ "$exact" = "bf16exact" ] || fail "bf16 -> .npy gave $dt $exact"
python3 -c "import sys; sys.exit(0 if float('$rel') < 0.05 else 1)" || fail "bf16 rel mse $rel"
# .safetensors keeps bf16, under the chosen name.
"$QVG" decode -i "$T/k.qvgt" -o "$T/k.safetensors" --tensor keys > /dev/null
read -r dt shape rel _ < <(check "$T/k.safetensors" "$T/kv.safetensors" keys)
[ "$dt" = "BF16" ] && [ "$shape" = "1x48x2x64" ] || fail "bf16 -> .safetensors gave $dt $shape"
# The .npy and .safetensors outputs hold the same values.
read -r dt shape rel _ < <(check "$T/k.npy" "$T/k.safetensors" "" keys)
[ "$rel" = "0" ] || fail ".npy and .safetensors decodes differ (rel $rel)"
# A rank-3 float32 tensor of a safetensors file reads as B = 1.
"$QVG" encode -i "$T/kv.safetensors" --tensor v -o "$T/v.qvgt" "${flags[@]}" > /dev/null
"$QVG" decode -i "$T/v.qvgt" -o "$T/v.safetensors" > /dev/null
read -r dt shape rel _ < <(check "$T/v.safetensors" "$T/kv.safetensors" "" v)
[ "$dt" = "F32" ] && [ "$shape" = "1x48x2x64" ] || fail "f32 rank-3 safetensors gave $dt $shape"
python3 -c "import sys; sys.exit(0 if float('$rel') < 0.05 else 1)" || fail "v rel mse $rel"

echo "encode_decode: OK"
