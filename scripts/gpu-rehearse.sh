#!/usr/bin/env bash
# Rehearses scripts/gpu-check on a machine without a GPU (issue 14): prepares
# .gpudeps/ (scripts/gpu-deps.sh), makes an environment with the GPU image's torch
# (torch==2.11.0 from PyPI, CUDA 13.0 build, as on the device machine; kept in
# ~/.cache/qvg/env-gpu-torch2.11-py<X.Y>, wheels in the wheelhouse ~/.cache/qvg/wheels),
# then runs `gpu-check --dry-run` and `gpu-check --build-only` with it: every part
# builds, the PyTorch extension against that torch included.
# Usage: scripts/gpu-rehearse.sh   (first run: about 3 GB of wheels, 5 GB of disk)
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${QVG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qvg}
wheels=${QVG_WHEELS:-$cache/wheels}
py=${QVG_PYTHON:-/usr/bin/python3}
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
env=$cache/env-gpu-torch2.11-py$pyver
req=(torch==2.11.0 scikit-build-core==1.1.2 numpy==2.4.6 pytest==9.2.0)
bash scripts/deps.sh --python
[[ -d .gpudeps/root/usr && -n "$(ls .gpudeps/wheels/*.whl 2>/dev/null)" ]] || bash scripts/gpu-deps.sh
if [[ ! -f $env/.qvg-complete ]]; then
  rm -rf "$env"
  "$py" -m venv "$env"
  pip=("$env/bin/python" -m pip --disable-pip-version-check)
  if ! "${pip[@]}" install -q --no-index --find-links "$wheels" "${req[@]}" 2>/dev/null; then
    mkdir -p "$wheels"
    "${pip[@]}" download -q -d "$wheels" --find-links "$wheels" "${req[@]}"
    "${pip[@]}" install -q --no-index --find-links "$wheels" "${req[@]}"
  fi
  touch "$env/.qvg-complete"
fi
echo "qvg: rehearsal environment $env: torch $("$env/bin/python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')"
export QVG_GPU_PYTHON=$env/bin/python OUT=${OUT:-build/gpu-rehearsal}
bash scripts/gpu-check --dry-run
bash scripts/gpu-check --build-only
