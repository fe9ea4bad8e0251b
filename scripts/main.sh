#!/usr/bin/env bash
# Builds qvg (release) and runs the main job: a streaming simulation of a scaled
# Self-Forcing workload through a dense cache and, side by side, two packed caches:
# the engine's default (int2, 128 centroids, spans of one chunk, keep_recent 1) and
# qvg's `recommended` profile (docs/quality.md), with a summary and a table of the two
# (the full-size model-level peak ratio: every layer's cache + one shared view; the
# time per denoising step; the attention error; each also against the engine's). The
# report (JSON and SVG charts) goes to build/simulate-report unless the arguments name
# another --report directory; a --profile argument replaces `recommended` (explicit
# flags override the profile).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
echo "qvg: building build/release/qvg (a first build takes about 5 minutes on 2 cores)"
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
echo "qvg: the simulation (about 1-2 minutes on 2 quiet cores, longer under load; one line per chunk)"
exec ./build/release/qvg simulate "${report[@]}" "${baseline[@]}" "${profile[@]}" "$@"
