"""Loads the compiled extension qvg._C after checking that it was built for this torch.

qvg._C links against torch's C++ libraries, whose ABI changes between releases:
loaded into another torch it would fail with an undefined-symbol error, or worse.
``_build.py`` (generated at build time) records the torch it was built against,
and this check turns a mismatch into an ImportError naming both versions.
"""

from __future__ import annotations

from types import ModuleType

import torch

_REBUILD = "rebuild qvg for it: pip install --no-build-isolation --force-reinstall --no-deps . (docs/python.md)"


def check_torch(built: str, running: str) -> None:
    """Raises ImportError unless the extension built against torch ``built`` may be
    loaded into torch ``running`` (the same version string, local tag included)."""
    if built != running:
        raise ImportError(f"qvg._C was built against torch {built}, but this environment has torch {running}: {_REBUILD}")


def load_extension() -> ModuleType:
    try:
        from . import _build
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise ImportError(
            "qvg.torch needs the compiled extension qvg._C, which is not built: install qvg with pip "
            "(pip install --no-build-isolation ., docs/python.md)"
        ) from e
    check_torch(_build.TORCH_VERSION, torch.__version__)
    from . import _C

    return _C
