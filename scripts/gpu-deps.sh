#!/usr/bin/env bash
# Prepares .gpudeps/ (ignored by git): the Debian packages the library core needs
# at build time and run time, unpacked with dpkg -x, for the device machine, which
# has CUDA, CMake, ninja and a compiler but no apt and no network.
# Run here (network, apt) once; then name `.gpudeps` in the device call's carry list
# and run scripts/gpu-check there (docs/cuda.md).
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(libfmt-dev libfmt9 libhwy-dev libhwy1 nlohmann-json3-dev libcli11-dev libxxhash-dev)
rm -rf .gpudeps
mkdir -p .gpudeps/debs .gpudeps/root
(cd .gpudeps/debs && apt-get download "${pkgs[@]}")
for f in .gpudeps/debs/*.deb; do dpkg -x "$f" .gpudeps/root; done
rm -rf .gpudeps/debs
# The reference codec for the GPU check's comparison (pure Python; installed there
# with --no-deps into a folder of its own), pinned as in the conformance tests.
python3 -m pip download -q --no-deps --only-binary=:all: -d .gpudeps/wheels quant-videogen==0.1.0
echo "qvg: .gpudeps ready ($(du -sh .gpudeps | cut -f1)): ${pkgs[*]}"
