"""The places a study's trainings run in: ``--jobs`` of them, shared by every study of one
command, handed out in turn (the waiting run of fewest steps first), with room for runs that go
ahead of the rate rule (``--ahead``) only in places nothing else asks for."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading

from scaling_ledger import candidates


class Places:
    """What the studies of several ledgers running at once share: ``jobs`` places for trainings,
    one lock for the ledgers and reports they write, and whether a run has crashed.

    When runs wait for a place, the next free one goes to the run of fewest steps (then to the
    earliest to ask): a shorter budget's seed runs, which finish that budget's answer and can
    settle a tie, do not wait hours behind a longer budget's sweep.

    A run that goes ahead (``ahead=True``: one the rule may not need) waits behind every other
    run, and at most ``jobs - 1`` of them hold places at once, so that a place is always left
    for the run the rule asks for next: with one place, nothing goes ahead."""

    def __init__(self, jobs: int):
        self.free = jobs
        self.ahead_room = jobs - 1  # places a run going ahead may still take
        self._turns = threading.Condition()
        self._waiting: list[tuple[bool, int, int]] = []  # a heap of (ahead, steps, arrival)
        self._arrivals = itertools.count()
        self.lock = threading.Lock()
        self.failed = threading.Event()  # a run crashed: no other starts

    @contextlib.contextmanager
    def place(self, steps: int, ahead: bool = False, unless=None):
        """Hold one of the places for a run of ``steps`` steps (waiting for it in turn); yields
        True. With ``unless`` (a callable), the wait ends without a place, yielding False, once
        ``unless()`` is true (checked when a place frees or :meth:`wake` is called)."""
        ticket = (ahead, steps, next(self._arrivals))
        gives_up = unless or (lambda: False)
        with self._turns:
            heapq.heappush(self._waiting, ticket)
            self._turns.wait_for(
                lambda: (
                    gives_up() or (self.free > 0 and self._waiting[0] == ticket and (not ahead or self.ahead_room > 0))
                )
            )
            granted = not gives_up()
            if granted:
                heapq.heappop(self._waiting)
                self.free -= 1
                self.ahead_room -= ahead
            else:
                self._waiting.remove(ticket)
                heapq.heapify(self._waiting)
            self._turns.notify_all()  # the next in line may take another free place
        if not granted:
            yield False
            return
        try:
            yield True
        finally:
            with self._turns:
                self.free += 1
                self.ahead_room += ahead
                self._turns.notify_all()

    def wake(self) -> None:
        """Have the runs waiting for a place check their ``unless`` again."""
        with self._turns:
            self._turns.notify_all()


def go_ahead(study, point, arm: str, sweeping: threading.Event) -> None:
    """``--ahead``: while the arm's sweep (stage 1) runs, a place no other run asks for trains a
    seed run of the sweep's best finite rate so far on ``study`` (a ``scaling.Study``), the run
    stage 2 most likely asks for. The rule may pick another rate; the run then stays in the
    ledger unused (a rate run on every seed competes in a tie by its mean, as in ``decide``)."""
    while True:
        with study.changed:
            study.changed.wait_for(lambda: not sweeping.is_set() or ahead_key(study, point, arm) is not None)
        with study.places.place(study.args.steps, ahead=True, unless=lambda: not sweeping.is_set()) as granted:
            if not granted:
                return
            with study.changed:
                key = ahead_key(study, point, arm) if sweeping.is_set() else None
                if key is not None:
                    study.under_way.add(key)
            if key is not None:
                try:
                    study.train(point, arm, key[2], key[3])
                finally:
                    study.ended(key)


def ahead_key(study, point, arm: str) -> tuple[str, str, float, int] | None:
    """The ledger key of the run to go ahead: the first seed whose run of the sweep's best finite
    rate is neither in the ledger nor training; None when there is none."""
    with study.lock:  # the ledger grows on other threads
        ranked = candidates(study.sweep_finals(point, arm), study.tie_margin)
        done = set(study.ledger.rows)
    if not ranked:
        return None
    best = ranked[0]
    keys = [(str(point), arm, float(best), s) for s in study.args.seeds if s != study.args.sweep_seed]
    return next((k for k in keys if k not in done and k not in study.under_way), None)
