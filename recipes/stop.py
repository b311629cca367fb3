"""A clean stop of a training run on a signal: SIGTERM (preemption, a scheduler's time limit)
or Ctrl-C (SIGINT) asks the loop to finish its step, save a checkpoint and exit; a second Ctrl-C
aborts at once (the last saved checkpoint stays intact) and the process exits with 130.

Two Ctrl-Cs that arrive while the main thread is inside one long C call (a matmul, a backward,
a file write) reach Python as one handler call: the operating system's handler ran twice, but
Python runs the Python-level handler once. Every delivery also writes one byte into the wakeup
file descriptor (``signal.set_wakeup_fd``), so the deliveries are counted from those bytes, or
from the handler's calls where these are more (a byte is written just after the handler's flag
is raised, possibly by another thread, so a call can come before its byte). Python runs a
handler between bytecodes, also inside an earlier call of the same handler: every count is
added by one ``list.append``, which such a nested call cannot split, and the total is read after
it. A second Ctrl-C that comes after the loop (while the stop checkpoint is finished, the run's
last records are written) is remembered, and :meth:`StopOnSignal.exit_code` turns the run's
exit code into 130. After a Ctrl-C, :func:`exit_process` ends the process right after its
last look: ``sys.exit`` would fix the code before the interpreter's teardown (a second or more
with torch loaded, on a busy machine), and a Ctrl-C inside that would change nothing.

What no process can count: two Ctrl-Cs that reach it while the first is still pending in the
kernel (an overloaded machine that has not scheduled any of its threads in between) are one
signal, as standard signals are not queued; and one whose handler would run after the last look
at the count, in the few instructions before ``os._exit``, comes after the exit code is final."""

from __future__ import annotations

import os
import signal
import socket
import sys
from typing import NoReturn

import torch

from spherenet.train.distributed import all_reduce_max

__all__ = ["StopOnSignal", "ABORT_EXIT_CODE", "exit_process"]

#: The exit code of a run aborted by a second Ctrl-C (the shell's 128 + SIGINT).
ABORT_EXIT_CODE = 130


class StopOnSignal:
    """While entered, SIGTERM and SIGINT set :attr:`signal` instead of ending the process (a
    second SIGINT raises ``KeyboardInterrupt``); on exit the previous SIGTERM handler comes back,
    and so does SIGINT's unless a first Ctrl-C was received: then a later one is only recorded
    (:attr:`aborted`), to be read by :meth:`exit_code`. ``announce``: print what Ctrl-C does (rank 0)."""

    #: The instance entered last in this process: the recipe's entry point reads its exit code.
    last: StopOnSignal | None = None

    def __init__(self, announce: bool):
        self.announce = announce
        self.signal: int | None = None
        self.aborted = False
        self._sigint_bytes: list[int] = []  # per read of the wakeup descriptor, the SIGINT bytes in it
        self._sigint_calls: list[int] = []  # one item per handler call for a SIGINT
        self._previous: dict = {}
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._previous_wakeup_fd = -1

    def __enter__(self) -> StopOnSignal:
        StopOnSignal.last = self
        self._previous = {sig: signal.signal(sig, self._request) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:  # the count of deliveries, even of those Python merged into one handler call
            reader, writer = socket.socketpair()
            reader.setblocking(False)
            writer.setblocking(False)
            self._previous_wakeup_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
            self._wakeup = (reader, writer)
        except (OSError, ValueError):  # not the main thread, or no socket pair: count handler calls
            self._wakeup = None
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGTERM, self._previous[signal.SIGTERM])
        self._read_deliveries()  # a delivery whose byte came after the handler's last call
        if self.sigints and not self.aborted:
            signal.signal(signal.SIGINT, self._late)  # a second Ctrl-C from here on: exit code 130
        else:
            signal.signal(signal.SIGINT, self._previous[signal.SIGINT])
            self._close_wakeup()

    def _close_wakeup(self) -> None:
        if self._wakeup is None:
            return
        try:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
        except ValueError:
            pass
        for end in self._wakeup:
            end.close()
        self._wakeup = None

    @property
    def sigints(self) -> int:
        """The SIGINT deliveries counted so far: the wakeup bytes read, or the handler's calls where
        these are more (no wakeup descriptor, or a byte not written yet)."""
        return max(sum(self._sigint_bytes), len(self._sigint_calls))

    def _read_deliveries(self) -> None:
        """Count the SIGINT bytes that reached the wakeup descriptor since the last read; a second
        one counted sets :attr:`aborted`."""
        while self._wakeup is not None:
            try:
                data = self._wakeup[0].recv(4096)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                break
            self._sigint_bytes.append(data.count(signal.SIGINT))
        if self.sigints >= 2:
            self.aborted = True

    def _request(self, signum, frame) -> None:
        if signum == signal.SIGINT:
            self._sigint_calls.append(signum)
        self._read_deliveries()  # after a SIGTERM too: a SIGINT that came with it counts
        if self.aborted:
            raise KeyboardInterrupt
        self.signal = self.signal or signum
        if signum == signal.SIGINT and self.announce:
            print(
                "\nCtrl-C: finishing this step and saving a checkpoint (Ctrl-C again to abort without it)",
                file=sys.stderr,
                flush=True,
            )

    def _late(self, signum, frame) -> None:
        """A Ctrl-C after the loop: counted, not raised; a second one makes the exit code 130 (see
        :meth:`exit_code`). The call can also be the first Ctrl-C's, whose byte was read as the
        loop ended."""
        self._sigint_calls.append(signum)
        self._read_deliveries()

    def exit_code(self, code: int, ending: bool = False) -> int:
        """``code``, or 130 when a second Ctrl-C came (the wakeup bytes read once more, for one
        whose handler call merged with the first's). ``ending``: the process ends right after
        (:func:`exit_process`), so a later Ctrl-C is still recorded; otherwise (a caller that goes
        on, such as a notebook) SIGINT's handler from before the run comes back."""
        self._read_deliveries()
        self._close_wakeup()
        if self.sigints and not ending:
            signal.signal(signal.SIGINT, self._previous[signal.SIGINT])
        return ABORT_EXIT_CODE if self.aborted else code

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def describe(self) -> str:
        """The signal's name, or where the request came from when it was not this process's."""
        return signal.Signals(self.signal).name if self.signal is not None else "on another rank"

    def agreed(self, distributed: bool) -> bool:
        """Whether the loop stops after this step: a stop requested here or, ``distributed``, on
        any rank (a collective every rank calls at every step, so that all leave at the same step)."""
        stop = self.requested
        if distributed:
            stop = bool(all_reduce_max(torch.tensor(float(stop))) > 0)
        return stop

    def saved_at(self, step: int) -> str:
        """The line that reports the stop, once its checkpoint is saved at ``step``."""
        return f"stop requested ({self.describe()}): checkpoint saved at step {step}; continue with --resume"


def exit_process(code: int) -> NoReturn:
    """End the process with ``code``: the way out of a recipe's ``__main__``. Without a Ctrl-C,
    as ``sys.exit``. After one, the run has already saved and closed what it writes, so the exit
    code is read once more (130 if a second Ctrl-C came since) and the process ends at once, its
    standard streams flushed, without the interpreter's teardown."""
    stop = StopOnSignal.last
    if stop is None or not stop.sigints:
        sys.exit(code)
    code = stop.exit_code(code, ending=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be said there
            pass
    # SIGINT is not blocked: the kernel hands it to this (running) thread, whose handler runs
    # before the next bytecode; blocking it would send it to an idle thread, which might not run
    # before the process ends.
    os._exit(ABORT_EXIT_CODE if stop.aborted else code)
