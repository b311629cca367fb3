"""Waiting for a signal to reach a process, for tests that send two of the same.

Standard signals are not queued: a second SIGINT sent while the first is still pending (the
process not yet scheduled to take it, on an overloaded machine) is dropped by the kernel, and no
program can count two. Tests that mean two Ctrl-Cs send the second once the first has left the
kernel's pending sets (``/proc/PID/status`` and each thread's). A signal meant for a running
process is sent while the process is stopped (:func:`send_while_alive`): between a test's look
and its ``kill`` the process could end, and a signal to a process that has ended is lost."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


def signal_pending(pid: int, sig: int = signal.SIGINT) -> bool:
    """Whether ``sig`` waits in ``pid``'s shared pending set or in one of its threads' own
    (False where /proc is absent, or the process is gone)."""
    bit = 1 << (sig - 1)
    for status in [Path(f"/proc/{pid}/status"), *Path(f"/proc/{pid}/task").glob("*/status")]:
        try:
            lines = status.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith(("ShdPnd:", "SigPnd:")) and int(line.split()[1], 16) & bit:
                return True
    return False


def wait_until_taken(pid: int, sig: int = signal.SIGINT, timeout: float = 60.0) -> None:
    """Return once ``sig`` is no longer pending in ``pid``; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while signal_pending(pid, sig):
        if time.monotonic() > deadline:
            raise AssertionError(f"signal {signal.Signals(sig).name} still pending in process {pid} after {timeout} s")
        time.sleep(0.001)


def process_state(pid: int) -> str:
    """The process's state letter from ``/proc/PID/stat`` ("Z": ended, not yet reaped; "" once it
    is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


@contextlib.contextmanager
def held_stopped(proc: subprocess.Popen, timeout: float = 60.0) -> Iterator[bool]:
    """Hold ``proc`` stopped (SIGSTOP) for the block and continue it (SIGCONT) after: a signal sent
    inside stays pending until then. Yields False, holding nothing, when it had ended first."""
    if proc.poll() is not None:
        yield False
        return
    os.kill(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while (state := process_state(proc.pid)) not in ("T", "Z", "X", ""):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {proc.pid} not stopped after {timeout} s (state {state})")
        time.sleep(0.001)
    if state != "T":  # it ended before the stop took hold; not reaped yet, so its pid is still its own
        yield False
        return
    try:
        yield True
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def send_while_alive(proc: subprocess.Popen, sig: int = signal.SIGINT, timeout: float = 60.0) -> bool:
    """Send ``sig`` to ``proc`` while it certainly runs: held stopped (:func:`held_stopped`), so
    that it is pending until the process goes on. False, with nothing sent, when it had ended first."""
    with held_stopped(proc, timeout) as alive:
        if alive:
            os.kill(proc.pid, sig)
    return alive
