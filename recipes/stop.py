"""A clean stop of a training run on a signal: SIGTERM (preemption, a scheduler's time limit)
or Ctrl-C (SIGINT) asks the loop to finish its step, save a checkpoint and exit; a second Ctrl-C
aborts at once (the last saved checkpoint stays intact)."""

from __future__ import annotations

import signal
import sys

__all__ = ["StopOnSignal"]


class StopOnSignal:
    """While entered, SIGTERM and SIGINT set :attr:`signal` instead of ending the process (a
    second SIGINT raises ``KeyboardInterrupt``); on exit the previous handlers come back.
    ``announce``: print what Ctrl-C does (rank 0)."""

    def __init__(self, announce: bool):
        self.announce = announce
        self.signal: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> StopOnSignal:
        self._previous = {sig: signal.signal(sig, self._request) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _request(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signum
        if signum == signal.SIGINT and self.announce:
            print(
                "\nCtrl-C: finishing this step and saving a checkpoint (Ctrl-C again to abort without it)",
                file=sys.stderr,
                flush=True,
            )

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def describe(self) -> str:
        """The signal's name, or where the request came from when it was not this process's."""
        return signal.Signals(self.signal).name if self.signal is not None else "on another rank"
