#!/usr/bin/env bash
# Prepares .gpudeps/ (ignored by git): the Debian packages the library core needs
# at build time and run time, unpacked with dpkg -x, for the device machine, which
# has CUDA, CMake, ninja and a compiler but no apt and no network.
# Run here (network, apt) once; then name `.gpudeps` in the device call's carry list
# and run scripts/gpu-check there (docs/cuda.md).
# `scripts/gpu-deps.sh --engine` only refreshes .gpudeps/engine (the rehearsal's need).
set -euo pipefail
cd "$(dirname "$0")/.."

engine_files() {
  # The engine's four cache modules for the step benchmark (bench/step_bench.py, issue 37;
  # python/gpu/engineload.py loads them without the rest of SGLang), extracted from the
  # pinned wheel (the wheelhouse of scripts/python.sh when it has it).
  local wheels whl
  wheels=${QVG_WHEELS:-${QVG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qvg}/wheels}
  whl=$(ls "$wheels"/sglang-0.5.23-*.whl 2>/dev/null | head -n 1 || true)
  if [[ -z $whl ]]; then
    mkdir -p .gpudeps/sglang-wheel
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
      --platform manylinux_2_34_x86_64 -d .gpudeps/sglang-wheel sglang==0.5.23
    whl=$(ls .gpudeps/sglang-wheel/sglang-0.5.23-*.whl)
  fi
  rm -rf .gpudeps/engine
  python3 - "$whl" .gpudeps/engine <<'PY'
import sys, zipfile
names = ["sglang/multimodal_gen/configs/quantization/qvg_kv.py",
         "sglang/multimodal_gen/runtime/utils/logging_utils.py",
         "sglang/multimodal_gen/runtime/layers/kvcache/causal_attention_cache.py",
         "sglang/multimodal_gen/runtime/layers/kvcache/qvg_packed_cache.py"]
with zipfile.ZipFile(sys.argv[1]) as z:
    for n in names:
        z.extract(n, sys.argv[2])
PY
  rm -rf .gpudeps/sglang-wheel
}
if [[ ${1:-} == --engine ]]; then
  mkdir -p .gpudeps
  engine_files
  echo "qvg: .gpudeps/engine ready (the engine's cache modules, sglang 0.5.23)"
  exit 0
fi

pkgs=(libfmt-dev libfmt9 libhwy-dev libhwy1 nlohmann-json3-dev libcli11-dev libxxhash-dev)
rm -rf .gpudeps
mkdir -p .gpudeps/debs .gpudeps/root
(cd .gpudeps/debs && apt-get download "${pkgs[@]}")
for f in .gpudeps/debs/*.deb; do dpkg -x "$f" .gpudeps/root; done
rm -rf .gpudeps/debs
# The reference codec for the GPU check's comparison (pure Python; installed there
# with --no-deps into a folder of its own), pinned as in the conformance tests.
python3 -m pip download -q --no-deps --only-binary=:all: -d .gpudeps/wheels quant-videogen==0.1.0
engine_files
echo "qvg: .gpudeps ready ($(du -sh .gpudeps | cut -f1)): ${pkgs[*]}"
