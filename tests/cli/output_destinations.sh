#!/usr/bin/env bash
# The CLI's output destinations (spec 5.1, "Files"; docs/reliability.md, findings 14, 15):
#  * `qvg encode/decode --output` refuse a destination that exists and is not a
#    regular file (a FIFO, a symlink to a FIFO, a directory): exit status 1, one
#    "qvg: error: ..." line naming the path, the destination unchanged, no temporary
#    left; a symlink to a regular file is followed (the link stays, its target is
#    replaced).
#  * under a file-size limit (`ulimit -f`) encode and decode do not die of SIGXFSZ
#    (exit status 153): one line naming the size limit, no output, no `*.tmp.*` left.
# Usage: bash output_destinations.sh /path/to/qvg   (python3 standard library only)
set -euo pipefail
QVG=${1:?usage: output_destinations.sh /path/to/qvg}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# k.npy: float32 [1, 256, 4, 64] (256 KiB; its encoding at 2 bits is > 8 KiB).
python3 - "$T" <<'PY'
import random, struct, sys
T = sys.argv[1]
random.seed(3)
n = 256 * 4 * 64
vals = [random.gauss(0, 1) for _ in range(n)]
d = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 256, 4, 64), }"
d += " " * ((64 - (10 + len(d) + 1) % 64) % 64) + "\n"
open(T + "/k.npy", "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode()
                               + struct.pack("<%df" % n, *vals))
PY
codec=(--bits 2 --centroids 16 --threads 2)
"$QVG" encode --input "$T/k.npy" --output "$T/k.qvgt" "${codec[@]}" > /dev/null || fail "plain encode failed"

# no_temporaries DIR: nothing named *.tmp.* in DIR.
no_temporaries() {
  local left
  left=$(find "$1" -maxdepth 1 -name '*.tmp.*' | head -5)
  [ -z "$left" ] || fail "$2: temporaries left: $left"
}

# one_line_error NAME RC PATTERN: exit status 1 and one stderr line matching PATTERN.
one_line_error() {
  local name=$1 rc=$2 pattern=$3
  [ "$rc" -eq 1 ] || fail "$name: exit status $rc, expected 1; stderr: $(head -c 300 "$T/err.txt")"
  [ "$(wc -l < "$T/err.txt")" -eq 1 ] || fail "$name: stderr is not one line: $(head -c 400 "$T/err.txt")"
  grep -q "^qvg: error: " "$T/err.txt" || fail "$name: stderr: $(cat "$T/err.txt")"
  grep -Eqi -- "$pattern" "$T/err.txt" || fail "$name: stderr does not match '$pattern': $(cat "$T/err.txt")"
}

# ---- finding 14: destinations that are not regular files ----------------------------
mkdir "$T/d"
mkfifo "$T/d/fifo.qvgt" "$T/d/fifo.npy"
ln -s fifo.qvgt "$T/d/link.qvgt"
mkdir "$T/d/dir.qvgt"
for dest in fifo.qvgt link.qvgt; do
  rc=0
  timeout 60 "$QVG" encode --input "$T/k.npy" --output "$T/d/$dest" "${codec[@]}" > /dev/null 2> "$T/err.txt" || rc=$?
  one_line_error "encode --output $dest" "$rc" "$dest.*FIFO.*regular file"
  [ -p "$T/d/fifo.qvgt" ] || fail "encode --output $dest: the FIFO was replaced"
done
[ -L "$T/d/link.qvgt" ] || fail "the symlink was replaced"
rc=0
timeout 60 "$QVG" encode --input "$T/k.npy" --output "$T/d/dir.qvgt" "${codec[@]}" > /dev/null 2> "$T/err.txt" || rc=$?
one_line_error "encode --output DIR" "$rc" "dir\.qvgt.*directory"
[ -d "$T/d/dir.qvgt" ] && [ -z "$(ls -A "$T/d/dir.qvgt")" ] || fail "the directory was changed"
rc=0
timeout 60 "$QVG" decode --input "$T/k.qvgt" --output "$T/d/fifo.npy" > /dev/null 2> "$T/err.txt" || rc=$?
one_line_error "decode --output FIFO" "$rc" "fifo\.npy.*FIFO.*regular file"
[ -p "$T/d/fifo.npy" ] || fail "decode replaced the FIFO"
no_temporaries "$T/d" "finding 14"
# A symlink to a regular file is followed: the link stays, the target gets the file.
mkdir "$T/s"
echo old > "$T/s/real.qvgt"
ln -s real.qvgt "$T/s/link.qvgt"
"$QVG" encode --input "$T/k.npy" --output "$T/s/link.qvgt" "${codec[@]}" > /dev/null || fail "encode through a symlink"
[ -L "$T/s/link.qvgt" ] || fail "the symlink to a regular file was replaced"
cmp -s "$T/s/real.qvgt" "$T/k.qvgt" || fail "the symlink's target does not hold the encoding"
no_temporaries "$T/s" "symlink"

# ---- finding 15: the file-size limit -------------------------------------------------
mkdir "$T/f"
for cmd in encode decode; do
  if [ "$cmd" = encode ]; then args=(encode --input "$T/k.npy" --output "$T/f/ko.qvgt" "${codec[@]}"); out=ko.qvgt
  else args=(decode --input "$T/k.qvgt" --output "$T/f/ko.npy"); out=ko.npy; fi
  rc=0
  (ulimit -f 8; exec timeout 120 "$QVG" "${args[@]}") > /dev/null 2> "$T/err.txt" || rc=$?
  [ "$rc" -ne 153 ] || fail "$cmd under ulimit -f 8 died of SIGXFSZ (exit status 153)"
  one_line_error "$cmd under ulimit -f 8" "$rc" "$out.*(file-size limit|file too large)"
  [ ! -e "$T/f/$out" ] || fail "$cmd under ulimit -f 8 wrote $out"
  no_temporaries "$T/f" "$cmd under ulimit -f 8"
done

echo "output_destinations: OK"
