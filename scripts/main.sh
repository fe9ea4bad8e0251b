#!/usr/bin/env bash
# Builds qvg (release) and runs the main job: a streaming simulation of a scaled
# Self-Forcing workload through a dense and a packed cache, with a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target qvg
exec ./build/release/qvg simulate "$@"
