#!/usr/bin/env bash
# Builds qvg and runs every test: the CI configuration (optimised, warnings as
# errors) and the AddressSanitizer + UBSanitizer configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)
# Wall time of each step, printed as it ends and once more at the end (the time budgets
# are per step: e.g. the fuzz step at most 8 minutes).
declare -a step_times=()
step_begin=$SECONDS
step_done() {
  local t=$((SECONDS - step_begin))
  step_times+=("$1: $t s")
  echo "qvg: step '$1' took $t s"
  step_begin=$SECONDS
}
trap 'if ((${#step_times[@]})); then printf "qvg: step times: %s\n" "$(IFS=";"; echo "${step_times[*]}")"; fi' EXIT

echo "=== qvg: the layers point down only (scripts/check-layers.py) ==="
python3 scripts/check-layers.py
echo "=== qvg: each setting named in few source files (scripts/check-setting-names.py) ==="
python3 scripts/check-setting-names.py
step_done "deps and layers"

# Each step's header says about how long it takes on a 2-core machine (quiet - busy).
declare -A estimate=([ci]="8-15 min" [asan]="8-16 min")
for preset in ci asan; do
  echo "=== qvg: configure, build and test the '$preset' preset (about ${estimate[$preset]} on 2 cores) ==="
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  ctest --preset "$preset"
  step_done "$preset"
done

# The libFuzzer targets (a separate clang 14 build with ASan + UBSan, the 'fuzz' preset):
# every target replays its committed corpus and runs a fixed, seeded number of inputs;
# a crash fails the run and prints the reproducer (docs/reliability.md).
echo "=== qvg: fuzz targets (clang 14, libFuzzer + ASan + UBSan): corpus replay and seeded runs (about 3 min) ==="
bash scripts/fuzz.sh --ci
step_done "fuzz"

# The CUDA backend, compile only (no GPU here): every default architecture (sm_90a, 80,
# 89, 100, 120), warnings as errors, plus its
# host-side test of the shared kernel arithmetic. The GPU tests run on a device
# machine through scripts/gpu-check (docs/cuda.md).
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH=/usr/local/cuda/bin:$PATH; fi
if command -v nvcc >/dev/null; then
  echo "=== qvg: compile the CUDA backend (cuda-compile preset, sm_90a/80/89/100/120) and run its host-side tests (about 5-7 min) ==="
  cmake --preset cuda-compile >/dev/null
  cmake --build --preset cuda-compile -j "$jobs"  # every target of the preset: library, host tests, GPU binaries, CLI
  ctest --preset cuda-compile
  step_done "cuda-compile"
else
  echo "=== qvg: nvcc not found (PATH, /usr/local/cuda/bin): CUDA backend compile step skipped ==="
fi

# The Python package (qvg.torch, qvg.distributed): built and installed by pip into a
# virtual environment with torch from PyPI, then its pytest suite (scripts/python.sh).
echo "=== qvg: the Python package: pip install into build/venv and pytest (about 6-10 min; a first run 3 min more) ==="
bash scripts/python.sh
step_done "python"
