"""The PEP 517 build backend of qvg: scikit-build-core after one check.

qvg._C is compiled against the torch installed in the environment that runs the
build, so a build without torch stops here with one line instead of deep inside
CMake; so does one without scikit-build-core (with --no-build-isolation pip does
not install build requirements). Every hook is scikit-build-core's.
"""

from __future__ import annotations

import importlib.util
import sys


def _backend():
    try:
        from scikit_build_core import build
    except ImportError:
        sys.exit("qvg: scikit-build-core is not installed in this environment: pip install scikit-build-core "
                 "(with --no-build-isolation pip does not install build requirements)")
    return build


def _require_torch() -> None:
    if importlib.util.find_spec("torch") is None:
        sys.exit(f"qvg: torch is not installed for {sys.executable}: install torch first (pip install torch), then "
                 "build qvg with pip install --no-build-isolation . (docs/python.md)")


def get_requires_for_build_wheel(config_settings=None):
    _require_torch()
    return _backend().get_requires_for_build_wheel(config_settings)


def get_requires_for_build_editable(config_settings=None):
    _require_torch()
    return _backend().get_requires_for_build_editable(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    return _backend().get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _backend().prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _backend().prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _require_torch()
    return _backend().build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _require_torch()
    return _backend().build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    return _backend().build_sdist(sdist_directory, config_settings)
