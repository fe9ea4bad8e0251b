#!/usr/bin/env bash
# The Python package's test: a virtual environment with the pinned torch from PyPI
# (python/requirements-test.txt), qvg built and installed into it by pip
# (pip install --no-build-isolation ., scikit-build-core over the CMake build) and
# its pytest suite (python/tests). Run by scripts/test.sh; docs/python.md.
#
# Environment (all optional):
#   QVG_PYTHON     the interpreter the environment is made from (default /usr/bin/python3)
#   QVG_VENV       the environment (default build/venv; reused when it exists)
#   QVG_WHEELS     downloaded wheels, kept between runs (default ~/.cache/qvg/wheels):
#                  pip's own HTTP cache does not keep them when the index's responses
#                  carry no caching headers, as through this CI's proxy
#   QVG_CUDA_ARCHS CUDA architectures of the extension's CUDA path (default 90a)
# Usage: scripts/python.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --python
py=${QVG_PYTHON:-/usr/bin/python3}
venv=${QVG_VENV:-build/venv}
wheels=${QVG_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/qvg/wheels}
req=python/requirements-test.txt
t0=$(date +%s)

if [[ ! -x "$venv/bin/python" ]]; then
  echo "qvg: creating the virtual environment $venv ($("$py" --version))"
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
# The pinned wheels: offline from the wheelhouse when it has them all, else the
# missing ones are downloaded into it first.
if ! "${pip[@]}" install -q --no-index --find-links "$wheels" -r "$req" 2>/dev/null; then
  echo "qvg: downloading the wheels of $req into $wheels (first run: about 3.5 GB)"
  mkdir -p "$wheels"
  "${pip[@]}" download -q -d "$wheels" --find-links "$wheels" -r "$req"
  "${pip[@]}" install -q --no-index --find-links "$wheels" -r "$req"
fi
t1=$(date +%s)

# The extension: CUDA path when nvcc is found (then a version mismatch with torch is
# an error here: CI must compile the CUDA variant), CPU-only otherwise.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH=/usr/local/cuda/bin:$PATH; fi
cuda=AUTO
command -v nvcc >/dev/null && cuda=ON
echo "=== qvg: pip install --no-build-isolation . (QVG_TORCH_CUDA=$cuda) ==="
"${pip[@]}" install -q --no-build-isolation --no-deps --no-index \
  --config-settings=cmake.define.QVG_TORCH_CUDA=$cuda \
  --config-settings=cmake.define.QVG_CUDA_ARCHS="${QVG_CUDA_ARCHS:-90a}" \
  --config-settings=cmake.define.QVG_WERROR=ON .
t2=$(date +%s)
"$venv/bin/python" -c "import qvg, qvg._build as b; print(f'qvg {qvg.__version__}: built against torch {b.TORCH_VERSION}', \
  f'(CUDA path: nvcc {b.NVCC_VERSION}, archs {b.CUDA_ARCHS})' if b.CUDA else '(CPU-only)')"

echo "=== qvg: pytest python/tests ==="
rc=0
timeout 1200 "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests "$@" || rc=$?
t3=$(date +%s)
echo "qvg: python part: environment $((t1 - t0)) s, build and install $((t2 - t1)) s, pytest $((t3 - t2)) s"
if ((rc == 5)); then
  echo "qvg: pytest collected no tests in python/tests" >&2
  exit 1
fi
exit "$rc"
