#!/usr/bin/env bash
# The Python package's test: qvg built and installed by pip (pip install
# --no-build-isolation ., scikit-build-core over the CMake build) into a virtual
# environment with the pinned torch from PyPI (python/requirements-test.txt), then
# its pytest suite (python/tests). Run by scripts/test.sh; docs/python.md.
#
# Two environments, so that a fresh clone does not reinstall torch (5.4 GB, about
# two minutes of unpacking):
#   * the base environment, shared by every clone on the machine and made once per
#     interpreter and requirements file: ~/.cache/qvg/env-py<X.Y>-<hash>, holding
#     torch, scikit-build-core, pytest, numpy (and pip);
#   * the clone's environment build/venv (QVG_VENV), made in a second with the base
#     environment's site-packages on its path (a .pth file), into which pip installs
#     qvg: clones never write into the shared one.
# The wheels are downloaded once into a wheelhouse kept between runs
# (~/.cache/qvg/wheels, QVG_WHEELS): pip's own HTTP cache does not keep them when
# the index's responses carry no caching headers, as through this CI's proxy.
#
# Environment (all optional): QVG_PYTHON (default /usr/bin/python3), QVG_VENV,
# QVG_WHEELS, QVG_CACHE (default ~/.cache/qvg), QVG_CUDA_ARCHS (default 90a).
# Usage: scripts/python.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --python
py=${QVG_PYTHON:-/usr/bin/python3}
cache=${QVG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qvg}
wheels=${QVG_WHEELS:-$cache/wheels}
venv=${QVG_VENV:-build/venv}
req=python/requirements-test.txt
t0=$(date +%s)

pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
base=$cache/env-py$pyver-$(sha256sum "$req" | cut -c1-12)
mkdir -p "$cache"
(
  flock 9  # one clone at a time makes the base environment
  if [[ ! -f "$base/.qvg-complete" ]]; then
    echo "qvg: making the base environment $base"
    rm -rf "$base"
    "$py" -m venv "$base"
    pip=("$base/bin/python" -m pip --disable-pip-version-check)
    # Offline from the wheelhouse when it has every wheel, else download the missing ones first.
    if ! "${pip[@]}" install -q --no-index --find-links "$wheels" -r "$req" 2>/dev/null; then
      echo "qvg: downloading the wheels of $req into $wheels (first run: about 2.9 GB)"
      mkdir -p "$wheels"
      "${pip[@]}" download -q -d "$wheels" --find-links "$wheels" -r "$req"
      "${pip[@]}" install -q --no-index --find-links "$wheels" -r "$req"
    fi
    touch "$base/.qvg-complete"
  fi
) 9>"$cache/.env.lock"
base_site=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [[ ! -x "$venv/bin/python" ]]; then
  "$py" -m venv --without-pip "$venv"
fi
venv_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$base_site" >"$venv_site/_qvg_base_env.pth"
# The test-only oracles (docs/compat.md): the engine and the reference codec with
# --no-deps and the few pinned packages their imported modules need, into the
# clone's environment, from the wheelhouse (downloaded into it the first time).
compat=python/requirements-compat.txt
cpip=("$venv/bin/python" -m pip --disable-pip-version-check)
# (quant_videogen is only looked up: it does not import under Triton 3.9, docs/compat.md.)
if ! "$venv/bin/python" -W ignore -c 'import importlib.util as u, termcolor, sglang.multimodal_gen.runtime.layers.kvcache.qvg_packed_cache
import flashdreams.core.attention.kvcache, importlib.metadata as md; md.distribution("vllm-omni")
assert u.find_spec("quant_videogen")' 2>/dev/null; then
  if ! "${cpip[@]}" install -q --no-deps --no-index --find-links "$wheels" -r "$compat" 2>/dev/null; then
    echo "qvg: downloading the wheels of $compat into $wheels (first run: about 55 MB)"
    "$base/bin/python" -m pip --disable-pip-version-check download -q --no-deps -d "$wheels" -r "$compat"
    "${cpip[@]}" install -q --no-deps --no-index --find-links "$wheels" -r "$compat"
  fi
fi
# The end-to-end suite's extra wheels (docs/compat.md section 5), the same way; the
# check reads the installed versions (importing the stages would take 15 s).
e2e=python/requirements-e2e.txt
if ! "$venv/bin/python" - "$e2e" 2>/dev/null <<'PY'
import importlib.metadata as m, re, sys
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, version = line.split("==")
        assert m.version(name) == version, line
PY
then
  if ! "${cpip[@]}" install -q --no-deps --no-index --find-links "$wheels" -r "$e2e" 2>/dev/null; then
    echo "qvg: downloading the wheels of $e2e into $wheels (first run: about 39 MB)"
    "$base/bin/python" -m pip --disable-pip-version-check download -q --no-deps -d "$wheels" -r "$e2e"
    "${cpip[@]}" install -q --no-deps --no-index --find-links "$wheels" -r "$e2e"
  fi
fi
t1=$(date +%s)

# The extension: CUDA path when nvcc is found (then a version mismatch with torch is
# an error here: CI must compile the CUDA variant), CPU-only otherwise.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH=/usr/local/cuda/bin:$PATH; fi
cuda=AUTO
command -v nvcc >/dev/null && cuda=ON
echo "=== qvg: pip install --no-build-isolation . (QVG_TORCH_CUDA=$cuda) ==="
"$venv/bin/python" -m pip --disable-pip-version-check install -q --no-build-isolation --no-deps --no-index \
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
