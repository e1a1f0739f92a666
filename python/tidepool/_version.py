# SPDX-License-Identifier: MIT
# The package's version: the one place it is written (setup.py reads it).
__version__ = "0.1.0"
