#!/usr/bin/env bash
# One option parser on every surface (docs/reliability.md, finding 27): the CLI reads
# the cache flags and the per-role --k-config/--v-config through the settings table's
# parser, as the engine's flags are read: no hex reals, booleans true/false/1/0 only, no
# duplicate or empty --k-config items, and --profile '' is an error, not "no profile".
# Each refusal is exit status 1 with one "qvg: error:" line.
# Usage: bash options.sh /path/to/qvg
set -euo pipefail
QVG=${1:?usage: options.sh /path/to/qvg}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# refused PATTERN -- command...: exit status 1 and one stderr line matching PATTERN.
refused() {
  local pattern=$1
  shift 2
  local rc=0
  timeout 60 "$@" > /dev/null 2> "$T/err.txt" || rc=$?
  [[ $rc -eq 1 ]] || fail "exit status $rc, not 1: $*"
  [[ $(wc -l < "$T/err.txt") -eq 1 ]] || fail "not one stderr line: $* -> $(cat "$T/err.txt")"
  grep -Eq "^qvg: error: .*$pattern" "$T/err.txt" || fail "message of $*: $(cat "$T/err.txt")"
}

M=(memory --model self-forcing-1.3b --bits 2)
S=(simulate --model self-forcing-1.3b --span-mode incremental --report "$T/never")
for r in 0x10 0X1p3 inf nan +1 " 1"; do
  refused "--span-break-ratio must be a number, got '" -- "$QVG" "${S[@]}" --span-break-ratio "$r"
done
refused "--span-break-ratio must be in \[0, 1e6\]" -- "$QVG" "${S[@]}" --span-break-ratio 2e6
[[ ! -e "$T/never" ]] || fail "a refused simulate wrote its report"
refused "--span-chunks must be an integer" -- "$QVG" "${M[@]}" --span-chunks 0x8
refused "--refine-bits must be 2, 3 or 4, got 5" -- "$QVG" "${M[@]}" --span-mode incremental --refine-recent 2 --refine-bits 5
for spec in "bits=4,bits=2" "bits=4," ",bits=4" "bits=4,,stages=2"; do
  refused "--k-config" -- "$QVG" "${M[@]}" --k-config "$spec"
done
refused "--k-config field 'asymmetric' must be a boolean \(true/false/1/0\), got 'yes'" -- \
  "$QVG" "${M[@]}" --k-config asymmetric=yes
refused "profile must be one of reference, hq, recommended, got ''" -- "$QVG" "${M[@]}" --profile ''
refused "profile must be one of reference, hq, recommended, got ''" -- "$QVG" simulate --model self-forcing-1.3b --profile ''

# The accepted forms still work (and read the same values as the engine's flags).
"$QVG" "${M[@]}" --span-mode incremental --refine-recent 2 --refine-bits 2 --k-config asymmetric=1,bits=int4 \
  --json > "$T/ok.json" || fail "accepted forms refused"
python3 - "$T/ok.json" <<'PY' || fail "values of the accepted forms"
import json, sys
d = json.load(open(sys.argv[1]))
assert d.get("refine_recent") == 2 and d.get("refine_bits") == 2, {k: d.get(k) for k in ("refine_recent", "refine_bits")}
PY
# int3, qvg's width (a row of qvg/code_format.h), on every width setting of the CLI.
"$QVG" "${M[@]}" --span-mode incremental --refine-recent 2 --refine-bits 3 --k-config bits=int3 --v-config bits=3 \
  --json > "$T/ok3.json" || fail "int3 refused"
python3 - "$T/ok3.json" <<'PY' || fail "values of int3"
import json, sys
d = json.load(open(sys.argv[1]))
assert d.get("refine_bits") == 3, d.get("refine_bits")
PY
refused "--k-config field 'bits' must be 2, 3 or 4 \(or int2, int3 or int4\), got 'int5'" -- \
  "$QVG" "${M[@]}" --k-config bits=int5
# Defaults by command: each command's help gives its default width
# and codebook size and why they differ; --profile recommended's help says what the
# profile sets (V's scale search off, as QuantArgs::apply_profile does).
cmd_help() { "$QVG" "$1" --help | tr -s ' \n' ' '; }
while IFS='|' read -r commands flag pattern; do
  for c in $commands; do
    cmd_help "$c" | grep -q -- "$pattern" || fail "$c --help: the $flag default is not explained"
  done
done <<'TABLE'
encode eval|--bits|--bits INT=4 .*default 4: spec 1's, for a tensor file.*simulate, compare and memory default to 2
encode eval|--centroids|--centroids INT=128 .*default 128.*simulate and compare default to 256
simulate compare|--bits|--bits [A-Z]*=2 .*default 2: the published QVG runs'.*encode and eval default to 4
simulate compare|--centroids|--centroids INT=256 .*default 256.*encode, eval and memory default to 128
TABLE
cmd_help memory | grep -q -- "--bits INT=2 .*the engine's defaults" || fail "memory --help: --bits default not explained"
for c in encode eval simulate compare memory; do
  cmd_help "$c" | grep -q "recommended (hq's codec with V's scale search off" \
    || fail "$c --help: --profile recommended not described as the profile is"
  cmd_help "$c" | grep -q "kmeans++, and" && fail "$c --help: the profile's help still names kmeans++ seeds"
done
echo "options: ok"
