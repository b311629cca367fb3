"""``recipes.stop.StopOnSignal``: one Ctrl-C asks for a clean stop; a second one, whenever it
comes, ends the run with exit code 130, also when both arrive inside one long C call (where
Python runs its handler once for the two) or after the training loop."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from recipes.stop import ABORT_EXIT_CODE, StopOnSignal


def send_later(*delays: float, sig: int = signal.SIGINT) -> threading.Thread:
    """Send ``sig`` to this process after each delay (seconds, one after the other)."""

    def run():
        for delay in delays:
            time.sleep(delay)
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


def test_sigterm_then_nothing_keeps_the_exit_code_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with StopOnSignal(announce=False) as stop:
        send_later(0.0, sig=signal.SIGTERM).join()
        time.sleep(0.05)
        assert stop.signal == signal.SIGTERM and stop.sigints == 0
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert stop.exit_code(0) == 0
