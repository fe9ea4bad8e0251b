#!/usr/bin/env bash
# libFuzzer targets of fuzz/ (docs/reliability.md), built by the 'fuzz' preset (clang 14,
# ASan + UBSan + coverage) in build/fuzz.
#
#   scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]
#       A time-boxed campaign of one target (npy, safetensors, qvgt, snapshot, cache_api)
#       at nice 19. New inputs go to build/fuzz/campaign/TARGET (kept between runs);
#       the committed seeds of fuzz/corpus/TARGET are read, never written. Prints one
#       summary line: executions, crashes, leaks, out-of-memory, timeouts.
#   scripts/fuzz.sh --ci
#       The test command's step: every target replays its committed corpus and the
#       reproducers of fixed findings (fuzz/regressions/TARGET), then runs a fixed,
#       seeded number of inputs (-seed=1 -runs=N, the same every time). A crash fails
#       the step and prints the reproducer.
#   scripts/fuzz.sh --seeds
#       Rewrites the seed corpora fuzz/corpus/ (fuzz/make_seeds.cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=$ROOT/build/fuzz
TARGETS=(npy safetensors qvgt snapshot cache_api)
# -runs per target in --ci: sized so that the whole step (build included) stays
# within its budget of 8 minutes on a 2-core machine (docs/reliability.md).
declare -A CI_RUNS=([npy]=100000 [safetensors]=60000 [qvgt]=40000 [snapshot]=25000 [cache_api]=1200)

build() {
  bash scripts/deps.sh --fuzz
  cmake --preset fuzz > /dev/null
  cmake --build --preset fuzz -j "$(nproc)"
}

dict_flag() {
  if [[ -f $ROOT/fuzz/dict/$1.dict ]]; then echo "-dict=$ROOT/fuzz/dict/$1.dict"; fi
}

# Prints an artifact libFuzzer wrote (crash-*, leak-*, oom-*, timeout-*) and how to replay it.
report_artifacts() {
  local t=$1 dir=$2 found=0
  for a in "$dir"/crash-* "$dir"/leak-* "$dir"/oom-* "$dir"/timeout-*; do
    [[ -e $a ]] || continue
    found=1
    echo "qvg fuzz: fuzz_$t: reproducer $a ($(stat -c %s "$a") bytes):" >&2
    xxd "$a" | head -n 16 >&2
    echo "qvg fuzz: replay with: $BUILD/fuzz_$t $a" >&2
  done
  return $found
}

summary() {  # TARGET LOG ARTIFACT_DIR SECONDS
  local t=$1 log=$2 dir=$3 secs=$4
  local execs crashes leaks ooms timeouts
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -n1 | grep -o '[0-9]*$' || echo 0)
  crashes=$(find "$dir" -maxdepth 1 -name 'crash-*' | wc -l)
  leaks=$(find "$dir" -maxdepth 1 -name 'leak-*' | wc -l)
  ooms=$(find "$dir" -maxdepth 1 -name 'oom-*' | wc -l)
  timeouts=$(find "$dir" -maxdepth 1 -name 'timeout-*' | wc -l)
  local alloc
  alloc=$(grep -o 'alloc: worst peak.*' "$log" | tail -n1 || true)
  echo "fuzz_$t: ${execs:-0} executions in ${secs} s, $crashes crashes, $leaks leaks, $ooms out-of-memory, $timeouts timeouts; ${alloc:-alloc: no input >= 1 KiB}"
}

case "${1:-}" in
  --seeds)
    build
    cmake --build --preset fuzz -j "$(nproc)" --target qvg_fuzz_seeds
    rm -rf "$ROOT/fuzz/corpus"
    "$BUILD/qvg_fuzz_seeds" "$ROOT/fuzz/corpus"
    ;;
  --ci)
    build
    rc=0
    for t in "${TARGETS[@]}"; do
      work=$BUILD/ci/$t
      rm -rf "$work" && mkdir -p "$work/new" "$work/artifacts"
      regress=()
      [[ -d $ROOT/fuzz/regressions/$t ]] && regress=("$ROOT/fuzz/regressions/$t")
      start=$(date +%s)
      set +e
      (cd "$work" && "$BUILD/fuzz_$t" $(dict_flag "$t") -seed=1 -runs="${CI_RUNS[$t]}" -timeout=60 -rss_limit_mb=2048 \
        -max_len=8192 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
        "$work/new" "$ROOT/fuzz/corpus/$t" "${regress[@]}" > "$work/log.txt" 2>&1)
      status=$?
      set -e
      summary "$t" "$work/log.txt" "$work/artifacts" $(( $(date +%s) - start ))
      if (( status != 0 )) || ! report_artifacts "$t" "$work/artifacts"; then
        echo "qvg fuzz: fuzz_$t failed (exit status $status); its log:" >&2
        grep -v '^#[0-9]' "$work/log.txt" | tail -n 60 >&2
        rc=1
      fi
    done
    exit "$rc"
    ;;
  ""|-h|--help)
    sed -n '2,20p' "$0"
    exit 2
    ;;
  *)
    t=$1
    secs=${2:?usage: scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]}
    shift 2
    [[ " ${TARGETS[*]} " == *" $t "* ]] || { echo "qvg fuzz: unknown target '$t' (${TARGETS[*]})" >&2; exit 2; }
    build
    work=$BUILD/campaign/$t
    stamp=$(date +%Y%m%d-%H%M%S)
    artifacts=$work/artifacts-$stamp
    mkdir -p "$work/corpus" "$artifacts"
    log=$work/log-$stamp.txt
    regress=()
    [[ -d $ROOT/fuzz/regressions/$t ]] && regress=("$ROOT/fuzz/regressions/$t")
    start=$(date +%s)
    set +e
    (cd "$work" && nice -n 19 "$BUILD/fuzz_$t" $(dict_flag "$t") -max_total_time="$secs" -timeout=60 -rss_limit_mb=2048 \
      -max_len=8192 -print_final_stats=1 -artifact_prefix="$artifacts/" "$@" \
      "$work/corpus" "$ROOT/fuzz/corpus/$t" "${regress[@]}" > "$log" 2>&1)
    status=$?
    set -e
    summary "$t" "$log" "$artifacts" $(( $(date +%s) - start ))
    echo "log: $log"
    report_artifacts "$t" "$artifacts" || true
    exit "$status"
    ;;
esac
