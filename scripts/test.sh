#!/usr/bin/env bash
# Builds qvg and runs every test: the CI configuration (optimised, warnings as
# errors) and the AddressSanitizer + UBSanitizer configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)
for preset in ci asan; do
  echo "=== qvg: configure, build and test the '$preset' preset ==="
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  ctest --preset "$preset"
done
