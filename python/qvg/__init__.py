"""qvg: a quantized, chunk-segmented causal K/V cache for autoregressive video diffusion.

The PyTorch integration lives in :mod:`qvg.torch` (``import qvg.torch``); it needs the
compiled extension ``qvg._C``, built with ``-DQVG_BUILD_PYTHON=ON`` (see the README).
Importing ``qvg`` alone does not import torch.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
