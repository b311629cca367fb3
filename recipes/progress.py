"""Progress bars for the recipes and studies: on a terminal only, and off with ``--no-progress``
(``train.progress=false`` for training)."""

from __future__ import annotations

import sys


def progress_bar(total: int, desc: str, enabled: bool = True, initial: int = 0, unit: str = "run"):
    """A tqdm bar on stderr, or None when turned off (``--no-progress``) or when stderr is not a
    terminal (a log file, CI), where a bar's redraws would only be noise; None for nothing to do."""
    if not enabled or total == 0 or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)
