#!/usr/bin/env bash
# Builds qvg (release) and runs the main job: a streaming simulation of a scaled
# Self-Forcing workload through a dense and a packed cache, with a summary. The
# report (JSON and SVG charts) goes to build/simulate-report unless the arguments
# name another --report directory.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target qvg
report=(--report build/simulate-report)
for a in "$@"; do
  [[ "$a" == --report || "$a" == --report=* ]] && report=()
done
exec ./build/release/qvg simulate "${report[@]}" "$@"
