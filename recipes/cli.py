"""What the command-line recipes share: their program name in usage lines."""

from __future__ import annotations

import os
import sys

__all__ = ["prog"]


def prog(module: str) -> str:
    """The name the user typed: the console script (``spherenet-train``) when run as one,
    else ``python -m <module>``."""
    invoked = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return invoked if invoked.startswith("spherenet-") else f"python -m {module}"
