"""Training runs as child processes that stop with the tool that started them.

``recipes.compare`` and ``benchmarks/convergence.py`` start each training as its own process
(:func:`run`), in its own process group, so a terminal's Ctrl-C reaches only the tool. Inside
:func:`stop_children_on_signals`, SIGTERM or SIGINT (Ctrl-C) to the tool is forwarded to every
running child's process group (a ``recipes.train`` child then finishes its step, saves a
checkpoint and exits); children still alive ``grace_s`` seconds later are killed (SIGKILL), as
they are at once on a second signal. No new child starts after the first signal, and the tool
exits with status 128 + the signal's number once its children are gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence

__all__ = ["Interrupted", "run", "stop_children_on_signals", "DEFAULT_GRACE_S"]

DEFAULT_GRACE_S = 60.0  # a training child needs to finish its step and write a checkpoint
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):
    """The tool received SIGTERM or SIGINT; its children are stopped. A BaseException (like
    KeyboardInterrupt) so that no ``except Exception`` on the way swallows it."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.children: dict[int, subprocess.Popen] = {}
        self.signalled: set[int] = set()  # pids whose group got the forwarded signal
        self.signum: int | None = None
        self.grace_s = DEFAULT_GRACE_S
        self.killer: threading.Timer | None = None
        self.depth = 0

    def reset(self) -> None:
        if self.killer is not None:
            self.killer.cancel()
        self.children.clear()
        self.signalled.clear()
        self.signum, self.killer = None, None


_state = _State()


def _send(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the child is its group's leader (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _forward(proc: subprocess.Popen, signum: int) -> None:
    """The first signal only once per child: a second SIGINT would abort a training child
    without its checkpoint."""
    if proc.pid not in _state.signalled:
        _state.signalled.add(proc.pid)
        _send(proc, signum)


def _kill_all() -> None:
    for proc in list(_state.children.values()):
        _send(proc, signal.SIGKILL)


def _on_signal(signum: int, frame) -> None:
    if _state.signum is not None:  # a second signal: no more waiting
        _kill_all()
        raise Interrupted(_state.signum)
    _state.signum = signum
    for proc in list(_state.children.values()):
        _forward(proc, signum)
    _state.killer = threading.Timer(_state.grace_s, _kill_all)
    _state.killer.daemon = True
    _state.killer.start()
    raise Interrupted(signum)


def run(cmd: Sequence[str], **popen_kwargs) -> int:
    """Run ``cmd`` to completion in a new process group and return its exit status; raises
    :class:`Interrupted` instead of starting it, or after it ended, when a stop was requested.
    ``popen_kwargs`` go to :class:`subprocess.Popen` (cwd, env, stdout, ...)."""
    proc = None
    try:
        with _state.lock:
            if _state.signum is not None:
                raise Interrupted(_state.signum)
            proc = subprocess.Popen(list(cmd), start_new_session=True, **popen_kwargs)
            _state.children[proc.pid] = proc
        if _state.signum is not None:  # the signal came while it was starting
            _forward(proc, _state.signum)
        rc = proc.wait()
    except BaseException:
        if proc is not None and proc.returncode is None:
            # Interrupted here (the main thread) or an error: the child must not outlive us.
            _forward(proc, _state.signum or signal.SIGTERM)
            try:
                proc.wait(timeout=_state.grace_s)
            except subprocess.TimeoutExpired:
                _send(proc, signal.SIGKILL)
                proc.wait()
        raise
    finally:
        if proc is not None:
            _state.children.pop(proc.pid, None)
    if _state.signum is not None:
        raise Interrupted(_state.signum)
    return rc


@contextlib.contextmanager
def stop_children_on_signals(grace_s: float = DEFAULT_GRACE_S) -> Iterator[None]:
    """While inside, SIGTERM/SIGINT stop the children started by :func:`run` (see the module
    docstring) and end the tool with ``SystemExit(128 + signal)``. Nested uses share the
    outermost one. Signal handlers can only be set in the main thread; elsewhere the children
    are still stopped when an exception leaves :func:`run`."""
    if _state.depth > 0:
        _state.depth += 1
        try:
            yield
        finally:
            _state.depth -= 1
        return
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, _on_signal) for sig in _SIGNALS} if main_thread else {}
    _state.reset()
    _state.grace_s = grace_s
    _state.depth = 1
    try:
        yield
    except Interrupted as exc:
        print(f"\n{exc}: stopped the training runs (finished runs are kept)", file=sys.stderr, flush=True)
        raise SystemExit(128 + exc.signum) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _state.depth = 0
        _state.reset()
