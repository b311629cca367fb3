"""``recipes.stop.StopOnSignal``: one Ctrl-C asks for a clean stop; a second one, whenever it
comes, ends the run with exit code 130, also when both arrive inside one long C call (where
Python runs its handler once for the two) or after the training loop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from signals import held_stopped, signal_pending, wait_until_taken

from recipes.stop import ABORT_EXIT_CODE, StopOnSignal

REPO = Path(__file__).resolve().parents[2]


def sigint_blocked_here() -> bool:
    return signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def send_later(*delays: float, sig: int = signal.SIGINT) -> threading.Thread:
    """Send ``sig`` to this process after each delay (seconds, one after the other), each once
    the one before has left the kernel's pending sets (else the kernel merges them)."""

    def run():
        for delay in delays:
            time.sleep(delay)
            wait_until_taken(os.getpid(), sig)
            os.kill(os.getpid(), sig)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def long_c_call(seconds: float) -> None:
    """Matrix products, each one C call during which no Python handler runs, for ``seconds``."""
    a = torch.randn(1500, 1500)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = (a @ a).clamp_(-1, 1)


def test_one_ctrl_c_requests_a_stop():
    with StopOnSignal(announce=False) as stop:
        send_later(0.0).join()
        time.sleep(0.05)  # the handler runs between bytecodes
        assert stop.requested and stop.signal == signal.SIGINT and not stop.aborted
    assert stop.exit_code(0) == 0


def test_two_ctrl_cs_inside_one_c_call_abort():
    """Both deliveries land while the main thread is in one matmul: the Python handler runs
    once, and it must still see two (the wakeup bytes count them)."""
    torch.set_num_threads(1)
    a = torch.randn(2500, 2500)
    began = time.monotonic()
    (a @ a).sum()  # how long one product takes on this machine
    one = time.monotonic() - began
    b = torch.randn(2500, 2500 * max(1, int(0.6 / max(one, 1e-3))))  # a call of about 0.6 s or more
    with pytest.raises(KeyboardInterrupt):
        with StopOnSignal(announce=False) as stop:
            sender = send_later(0.1, 0.05)
            try:
                (a @ b).sum()  # one C call, both signals arrive inside it
            finally:
                sender.join()
            time.sleep(0.05)
    assert stop.aborted and stop.exit_code(0) == ABORT_EXIT_CODE


class SecondCtrlCWhileRead:
    """The reading end of the wakeup descriptor, which sends this process the second Ctrl-C
    while the first one's handler reads it (the first read only)."""

    def __init__(self, reader):
        self.reader, self.sent = reader, False

    def recv(self, size: int) -> bytes:
        data = self.reader.recv(size)
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)  # taken by this thread before kill returns
        return data

    def close(self) -> None:
        self.reader.close()


def test_a_second_ctrl_c_during_the_first_ones_handler_aborts():
    """Python runs a signal handler between bytecodes, also inside an earlier call of the same
    handler: here the second Ctrl-C's handler call runs whole inside the first's, while that one
    reads the wakeup bytes. Neither call's count may be lost (the first's must not add to a total
    it read before the second's call)."""
    stop = StopOnSignal(announce=False)
    try:
        with pytest.raises(KeyboardInterrupt):
            with stop:
                reader, writer = stop._wakeup
                stop._wakeup = (SecondCtrlCWhileRead(reader), writer)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.1)
    finally:
        code = stop.exit_code(0)
    assert stop.aborted and code == ABORT_EXIT_CODE


def test_a_second_delivery_whose_wakeup_byte_comes_after_the_handler_counts():
    """Two Ctrl-Cs delivered at once to two threads can reach Python as one handler call, and the
    second delivery's wakeup byte can be written after that call read the descriptor (a thread
    writes it after raising the handler's flag): the byte alone counts it, once the loop ends."""
    stop = StopOnSignal(announce=False)
    with stop:
        send_later(0.0).join()
        time.sleep(0.05)  # the handler ran for the first
        stop._wakeup[1].send(bytes([signal.SIGINT]))  # the second delivery's byte, and no call of its own
    assert stop.exit_code(0) == ABORT_EXIT_CODE


def test_one_ctrl_c_whose_wakeup_byte_comes_after_its_handler_counts_once():
    """The handler call of one Ctrl-C can run before its delivery's byte is written (by another
    thread): the late byte is that same delivery, not a second one."""
    stop = StopOnSignal(announce=False)
    with stop:
        stop._request(signal.SIGINT, None)  # the call, before the byte
        stop._wakeup[1].send(bytes([signal.SIGINT]))
    assert stop.requested and stop.exit_code(0) == 0


CHILD_IN_STOP = """
import sys, time
from recipes.stop import StopOnSignal
with StopOnSignal(announce=False) as stop:
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not stop.requested and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.2)  # a second delivery, had there been one, is counted by now
print(stop.sigints, flush=True)
sys.exit(stop.exit_code(0))
"""


def test_two_ctrl_cs_while_the_first_is_still_pending_are_one_signal():
    """Standard signals are not queued: two SIGINTs sent while the first is still pending (the
    process held stopped here; on an overloaded machine, not scheduled yet) leave one pending
    signal, so the process sees one Ctrl-C and stops cleanly, exit 0. The one case in which a
    second Ctrl-C does not abort; once the first has left the pending set, the second always
    counts (the tests above, and the two-Ctrl-C fault tests)."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD_IN_STOP], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        with held_stopped(proc) as alive:
            assert alive
            os.kill(proc.pid, signal.SIGINT)
            os.kill(proc.pid, signal.SIGINT)
            assert signal_pending(proc.pid)  # one bit, however many were sent
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, out) == (0, "1\n")


def test_a_second_ctrl_c_after_the_loop_makes_the_exit_code_130():
    """The loop stopped on the first Ctrl-C and left the handler block; the second arrives
    while the run writes its last records."""
    stop = StopOnSignal(announce=False)
    with stop:
        send_later(0.0).join()
        time.sleep(0.05)
    assert stop.requested and not stop.aborted
    send_later(0.0).join()
    time.sleep(0.05)  # not a KeyboardInterrupt out of whatever code runs now
    assert stop.exit_code(0) == ABORT_EXIT_CODE


def test_after_the_exit_code_ctrl_c_is_the_callers_again():
    """A caller that goes on after a stopped run (a notebook, a script of several runs): the
    handler from before the run is back and a Ctrl-C interrupts it. SIGINT is never left blocked:
    the kernel would hand it to another thread, which might not run before the process ends."""
    before = signal.getsignal(signal.SIGINT)
    with StopOnSignal(announce=False) as stop:
        send_later(0.0).join()
        time.sleep(0.05)
    assert stop.exit_code(0) == 0
    assert signal.getsignal(signal.SIGINT) is before and not sigint_blocked_here()
    with pytest.raises(KeyboardInterrupt):
        send_later(0.0).join()
        time.sleep(1.0)
    ending = StopOnSignal(announce=False)
    with ending:
        send_later(0.0).join()
        time.sleep(0.05)
    try:
        assert ending.exit_code(0, ending=True) == 0
        send_later(0.0).join()  # the process ends next: a Ctrl-C from here on is still recorded
        time.sleep(0.05)
        assert ending.aborted and not sigint_blocked_here()
    finally:
        signal.signal(signal.SIGINT, before)


def test_sigterm_then_nothing_keeps_the_exit_code_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with StopOnSignal(announce=False) as stop:
        send_later(0.0, sig=signal.SIGTERM).join()
        time.sleep(0.05)
        assert stop.signal == signal.SIGTERM and stop.sigints == 0
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert stop.exit_code(0) == 0


def run_child(body: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """A Python process that enters ``StopOnSignal``, takes one Ctrl-C in it, then runs ``body``;
    an ``atexit`` hook writes ``teardown`` into ``tmp_path`` if the interpreter's teardown runs."""
    script = textwrap.dedent(
        f"""
        import atexit, os, signal, sys, time
        import torch
        from recipes.stop import StopOnSignal, exit_process
        atexit.register(lambda: open({str(tmp_path / "teardown")!r}, "w").close())
        torch.randn(256, 256) @ torch.randn(256, 256)  # torch's threads exist, as in a run
        with StopOnSignal(announce=False) as stop:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        """
    )
    return subprocess.run(
        [sys.executable, "-c", script + textwrap.dedent(body)], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_a_second_ctrl_c_after_the_exit_code_was_read_still_exits_130(tmp_path):
    """The run read its exit code (0: one Ctrl-C so far), then the second Ctrl-C comes while the
    process ends. ``sys.exit`` would run the interpreter's teardown, in which no Python handler
    runs, and exit 0; ``exit_process`` reads the code once more and ends at once."""
    child = run_child(
        """
        code = stop.exit_code(0, ending=True)  # as `python -m recipes.train` reads it
        assert code == 0, code
        os.kill(os.getpid(), signal.SIGINT)  # taken by this thread before kill returns (not blocked)
        print("stopped cleanly", end="")  # left in the buffer: exit_process flushes it
        exit_process(code)
        """,
        tmp_path,
    )
    assert child.returncode == ABORT_EXIT_CODE, (child.returncode, child.stderr[-2000:])
    assert child.stdout == "stopped cleanly"
    assert not (tmp_path / "teardown").exists()


def test_one_ctrl_c_exits_with_the_runs_code_and_its_output_flushed(tmp_path):
    child = run_child(
        """
        code = stop.exit_code(0, ending=True)
        print("stopped cleanly", end="")
        sys.stderr.write("last line")
        exit_process(code)
        """,
        tmp_path,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert (child.stdout, child.stderr) == ("stopped cleanly", "last line")
    assert not (tmp_path / "teardown").exists()


def test_without_a_ctrl_c_the_process_ends_through_the_normal_teardown(tmp_path):
    script = (
        "import atexit\n"
        "from recipes.stop import exit_process\n"
        f"atexit.register(lambda: open({str(tmp_path / 'teardown')!r}, 'w').close())\n"
        "exit_process(3)\n"
    )
    child = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert child.returncode == 3, child.stderr[-2000:]
    assert (tmp_path / "teardown").exists()
