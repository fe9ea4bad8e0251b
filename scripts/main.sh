#!/usr/bin/env bash
# Builds qvg (release) and runs the main job: a streaming simulation of a scaled
# Self-Forcing workload through a dense cache and, side by side, two packed caches:
# the engine's default (int2, 128 centroids, spans of one chunk, keep_recent 1) and
# qvg's `recommended` profile (docs/quality.md), with a summary and a table of the two
# (full-size memory, attention error). The report (JSON and SVG charts) goes to
# build/simulate-report unless the arguments name another --report directory; a
# --profile argument replaces `recommended` (explicit flags override the profile).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target qvg
report=(--report build/simulate-report)
baseline=(--engine-baseline)
profile=(--profile recommended)
for a in "$@"; do
  [[ "$a" == --report || "$a" == --report=* ]] && report=()
  [[ "$a" == --engine-baseline ]] && baseline=()
  [[ "$a" == --profile || "$a" == --profile=* ]] && profile=()
done
exec ./build/release/qvg simulate "${report[@]}" "${baseline[@]}" "${profile[@]}" "$@"
