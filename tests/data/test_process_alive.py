"""``process_alive``: the one probe with which a preparation's and an export's stale leftovers are told
from a live writer's."""

import os
import subprocess
import sys

from spherenet.data import process_alive


def test_this_process_is_alive():
    assert process_alive(os.getpid())


def test_an_exited_and_reaped_child_is_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process (until reused, which takes a wrap of the pid space)
    assert not process_alive(child.pid)


def test_a_process_that_refuses_the_probe_counts_as_alive(monkeypatch):
    """Another user's process: signal 0 is refused with EPERM, but the process is there."""
    probed = []

    def refuse(pid, sig):
        probed.append((pid, sig))
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", refuse)
    assert process_alive(12345)
    assert probed == [(12345, 0)]  # a probe, never a real signal
