#!/usr/bin/env bash
# scripts/gpu-check without a GPU, and its second part's verdict (docs/cuda.md):
#  * without a GPU (an `nvidia-smi` that lists none, first on PATH) the verdict run
#    exits 0 with one line, having removed every result an earlier run left in $OUT —
#    no old gpu-check.json may stand beside a run that checked nothing;
#  * scripts/gpu-part2-verdict.py brings part 2's exit statuses into gpu-check.json:
#    each test an acceptance, all_met recomputed, exit status 1 when one failed or did
#    not run (a measurement's status recorded, not judged).
# Usage: bash gpu_check.sh [/path/to/qvg]   (the qvg argument is not used; python3 only)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# ---- no GPU: earlier results removed ----
mkdir -p "$T/bin" "$T/out"
printf '#!/bin/sh\nexit 6\n' >"$T/bin/nvidia-smi"
chmod +x "$T/bin/nvidia-smi"
for f in gpu-check.json gpu-check.log gpu-bench.json ref-bench.json compat-check.json logs.tar.gz part2.tar.gz; do
  echo '{"all_met": true}' >"$T/out/$f"
done
set +e
PATH="$T/bin:$PATH" OUT="$T/out" bash "$ROOT/scripts/gpu-check" >"$T/stdout" 2>"$T/stderr"
rc=$?
set -e
[[ $rc == 0 ]] || fail "no GPU: exit status $rc, expected 0"
[[ $(wc -l <"$T/stdout") == 1 ]] || fail "no GPU: expected one line, got: $(cat "$T/stdout")"
grep -q "no CUDA device" "$T/stdout" || fail "no GPU: $(cat "$T/stdout")"
left=$(ls -A "$T/out")
[[ -z $left ]] || fail "no GPU: earlier results left in \$OUT: $left"

# ---- the verdict's build makes every host test its ctest step runs ----
# (`ctest -R ^cuda\.host` runs every cuda.host_* test of cmake/QvgCuda.cmake; a program
# the build did not make is "Not Run", and the step fails on the device.)
targets_line=$(grep -E '^targets=\(' "$ROOT/scripts/gpu-check") || fail "no targets=( line in scripts/gpu-check"
progs=$(sed -nE 's/.*add_test\(NAME cuda\.host_[a-z_]+ COMMAND ([a-z_]+)\).*/\1/p' "$ROOT/cmake/QvgCuda.cmake")
[[ -n $progs ]] || fail "no cuda.host_* tests found in cmake/QvgCuda.cmake"
for prog in $progs; do
  [[ " ${targets_line//[()]/ } " == *" $prog "* ]] || fail "gpu-check's build lacks $prog (a cuda.host_* test)"
done

# ---- part 2's verdict ----
verdict() {  # verdict STATUS_LINES...: a fresh verdict met everywhere, then the merge; prints its exit status
  printf '%s\n' "$@" >"$T/status"
  cat >"$T/v.json" <<'JSON'
{"steps": {}, "acceptances": [{"acceptance": "step build exits 0", "value": 0, "limit": "exit status 0", "met": true}], "all_met": true}
JSON
  set +e
  python3 "$ROOT/scripts/gpu-part2-verdict.py" "$T/v.json" "$T/status" >"$T/merge.out" 2>&1
  echo $?
  set -e
}
field() { python3 -c 'import json, sys; v = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$T/v.json" "$1"; }

[[ $(verdict "all_settings_tests 0 1" "all_settings_measure 0 1" "all_settings_pytest 0 1" "gpu_bench_full 3 0") == 0 ]] ||
  fail "all part-2 tests passed, yet exit status != 0: $(cat "$T/merge.out")"
[[ $(field 'v["all_met"]') == True ]] || fail "all part-2 tests passed, yet all_met false"
[[ $(field 'v["part2"]["steps"]["gpu_bench_full"]') == 3 ]] || fail "a measurement's status is not recorded"
[[ $(field 'len(v["acceptances"])') == 4 ]] || fail "expected 1 + 3 acceptances: $(cat "$T/v.json")"

[[ $(verdict "all_settings_tests 0 1" "all_settings_measure 1 1" "all_settings_pytest 0 1") == 1 ]] ||
  fail "a failed part-2 test did not fail the exit status"
[[ $(field 'v["all_met"]') == False ]] || fail "a failed part-2 test left all_met true"
[[ $(field '[a["met"] for a in v["acceptances"] if a["acceptance"] == "part 2: all_settings_measure exits 0"]') == "[False]" ]] ||
  fail "the failed test is not an unmet acceptance: $(cat "$T/v.json")"
grep -q "all_settings_measure exited 1" "$T/merge.out" || fail "the failed test is not named: $(cat "$T/merge.out")"

[[ $(verdict "all_settings_tests null 1" "all_settings_pytest 0 1") == 1 ]] || fail "a part-2 test that did not run passed"
[[ $(field 'v["all_met"]') == False ]] || fail "a part-2 test that did not run left all_met true"

[[ $(verdict "all_settings_tests zero 1") == 2 ]] || fail "a bad status line was accepted"
echo "gpu_check.sh: all checks passed"
