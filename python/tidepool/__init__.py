# SPDX-License-Identifier: MIT
"""tidepool: a GPU device-memory manager, as a pluggable allocator for PyTorch.

    import torch, tidepool.torch
    tidepool.torch.enable(limit="40GiB")      # before anything uses CUDA memory
    ...
    print(tidepool.torch.memory_summary())

Importing tidepool (and tidepool.torch) needs neither torch nor a GPU; the
native library (libtidepool_torch.so, shipped inside this package) loads the
CUDA driver itself when the first pool is created. See README.md.
"""
from ._version import __version__

__all__ = ["__version__", "library_path"]


def library_path():
    """Path of libtidepool_torch.so (the one inside the package, or
    $TIDEPOOL_TORCH_LIB when set)."""
    from . import _shim

    return _shim.library_path()
