#!/usr/bin/env bash
# Installs the Debian packages qvg builds and tests with, when any is missing (each at
# the version of this machine's Debian release; librsvg2-bin's rsvg-convert and DejaVu
# Sans render the report charts in tests/cli/svg_fit.py).
# Usage: scripts/deps.sh [--python | --fuzz]   (--python: what the Python package's build
#        and test need besides the C++ core's packages: the interpreter, its headers and venv;
#        torch itself comes from PyPI, scripts/python.sh; --fuzz: clang 14 with its
#        sanitizer/libFuzzer runtime and OpenMP, for the 'fuzz' preset)
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config libgtest-dev libgmock-dev librapidcheck-dev libbenchmark-dev
      libhwy-dev libcli11-dev libfmt-dev nlohmann-json3-dev libxxhash-dev libfaiss-dev libopenblas0-openmp
      python3-jsonschema librsvg2-bin fonts-dejavu-core)
if [[ "${1:-}" == "--python" ]]; then
  pkgs+=(python3 python3-dev python3-venv)
fi
if [[ "${1:-}" == "--fuzz" ]]; then
  pkgs+=(clang-14 libclang-rt-14-dev libomp-14-dev llvm-14 xxd)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "qvg: installing Debian packages: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
