#!/usr/bin/env bash
# Rehearses scripts/gpu-check on a machine without a GPU (docs/cuda.md). Makes a fresh
# virtual environment with the GPU image's torch (torch==2.11.0 from PyPI, its CUDA 13.0
# build, as on the device machine) plus pytest and numpy, and NONE of the reference's
# dependencies (termcolor, loguru, einops: the device image lacks some of them, so the
# reference must import from the pinned wheels of python/gpu/wheels alone); the
# environment is ~/.cache/qvg/env-gpu-torch2.11-py<X.Y> and its wheels are cached in
# ~/.cache/qvg/wheels-gpu. Then, with that interpreter, it runs
#   gpu-check --dry-run     every input present, every module each part imports importable
#                           (the reference imported exactly as the GPU steps import it)
#   gpu-check --build-only  the verdict's one build (CUDA library, GPU tests, qvg._C)
#   gpu-check --cpu-steps   every verdict step that needs no GPU: inputs, build, the host
#                           tests, the reference's import beside the built qvg, and the
#                           summary from the exit trap (the GPU steps "not run")
# and checks that the summary says all_met false with exactly the GPU steps not run.
# Usage: scripts/gpu-rehearse.sh   (first run: about 3 GB of wheels)
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${QVG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qvg}
wheels=${QVG_WHEELS:-$cache/wheels-gpu}
py=${QVG_PYTHON:-/usr/bin/python3}
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
env=$cache/env-gpu-torch2.11-py$pyver
req=(torch==2.11.0 numpy==2.4.6 pytest==9.2.0)
[[ -d .gpudeps/root/usr ]] || echo "qvg: no .gpudeps/: the build uses the system's packages (scripts/deps.sh)"
# The engine's cache modules for part 2's step benchmark (the rehearsal environment has no SGLang).
[[ -d .gpudeps/engine ]] || bash scripts/gpu-deps.sh --engine
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
for m in termcolor loguru einops quant_videogen; do
  if "$env/bin/python" -c "import $m" 2>/dev/null; then
    echo "qvg: the rehearsal environment has $m installed: it must come from python/gpu/wheels only"
    exit 1
  fi
done
echo "qvg: rehearsal environment $env: torch $("$env/bin/python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)'), no termcolor/loguru/einops/quant_videogen"
export QVG_GPU_PYTHON=$env/bin/python OUT=${OUT:-build/gpu-rehearsal}
rm -rf "$OUT"
bash scripts/gpu-check --dry-run
bash scripts/gpu-check --build-only
bash scripts/gpu-check --cpu-steps
"$env/bin/python" - "$OUT/gpu-check.json" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))
steps = v["steps"]
for s in ("inputs", "build", "host_tests", "ref_import"):
    assert steps.get(s, {}).get("rc") == 0, f"CPU step {s}: {steps.get(s)}"
not_run = sorted(a["acceptance"].split()[1] for a in v["acceptances"]
                 if a["acceptance"].startswith("step ") and a["met"] is None)
assert not_run == sorted(["ref_warm", "gpu_tests", "pytest_cuda", "compat_check", "gpu_bench", "ref_bench"]), not_run
assert v["all_met"] is False
print(f"qvg: rehearsal passed: CPU steps {', '.join(s for s in steps if s != '_total')} exit 0; "
      f"GPU steps not run: {', '.join(not_run)}; all_met false")
EOF
ls "$OUT"
