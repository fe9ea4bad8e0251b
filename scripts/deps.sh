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
  # apt's and dpkg's progress (hundreds of lines) goes to a log file, not to the job's
  # output: one line before, one after, and the log's tail if apt fails.
  log=$(mktemp "${TMPDIR:-/tmp}/qvg-apt.XXXXXX")
  echo "qvg: installing Debian packages: ${missing[*]} (about a minute per 100 MB; apt's output: $log)"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  if ! { $SUDO apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq -o Dpkg::Use-Pty=0 --no-install-recommends \
           "${missing[@]}"; } > "$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "qvg: apt-get failed; its whole output is in $log" >&2
    exit 1
  fi
  echo "qvg: installed ${#missing[@]} Debian package(s)"
fi
