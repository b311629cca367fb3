"""What the benchmark scripts record about the machine they ran on."""

from __future__ import annotations

import platform


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
