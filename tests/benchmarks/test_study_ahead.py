"""benchmarks/study_places.py and ``--ahead``: runs that go ahead of the rate rule take only
places no other run asks for, never the last one, and never train a run twice; the rule decides
as it would without them. The trainings are test_scaling_study.py's fake (a known curve)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from test_scaling_study import BEST, fake_train_one


def _until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _hold(places, steps: int, ahead: bool, got: list, release: threading.Event, unless=None) -> threading.Thread:
    def run() -> None:
        with places.place(steps, ahead=ahead, unless=unless) as granted:
            got.append(granted)
            if granted:
                release.wait(timeout=10)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_run_going_ahead_waits_behind_every_other_run(scaling):
    """Both places are taken; a run going ahead asks first, then a longer ordinary run: when one
    place frees, the ordinary run gets it."""
    places = scaling.Places(2)
    order: list[str] = []
    release = threading.Event()
    holders = [_hold(places, 100, False, [], release) for _ in range(2)]
    _until(lambda: places.free == 0)

    def run(steps: int, ahead: bool, name: str) -> None:
        with places.place(steps, ahead=ahead):
            order.append(name)

    threads = [threading.Thread(target=run, args=(10, True, "ahead"))]
    threads[0].start()
    _until(lambda: len(places._waiting) == 1)
    threads.append(threading.Thread(target=run, args=(10828, False, "ordinary")))
    threads[1].start()
    _until(lambda: len(places._waiting) == 2)
    release.set()
    for thread in [*holders, *threads]:
        thread.join(timeout=10)
    assert order == ["ordinary", "ahead"]


def test_runs_going_ahead_leave_one_place_free(scaling):
    """Three places: two runs going ahead get in, the third waits although a place is free, and
    gives up its wait when told to; an ordinary run takes the free place at once."""
    places = scaling.Places(3)
    release, stop = threading.Event(), threading.Event()
    got: list = []
    threads = [_hold(places, 100, True, got, release) for _ in range(2)]
    _until(lambda: got == [True, True])
    third = _hold(places, 100, True, got, release, unless=stop.is_set)
    _until(lambda: len(places._waiting) == 1)
    assert places.free == 1 and places.ahead_room == 0 and got == [True, True]
    with places.place(100) as granted:  # the ordinary run is not kept waiting
        assert granted and places.free == 0
    stop.set()
    places.wake()
    third.join(timeout=10)
    assert got == [True, True, False] and places._waiting == []
    release.set()
    for thread in threads:
        thread.join(timeout=10)
    assert places.free == 3 and places.ahead_room == 2


def test_with_one_place_nothing_goes_ahead(scaling):
    places = scaling.Places(1)
    stop, got = threading.Event(), []
    waiter = _hold(places, 100, True, got, threading.Event(), unless=stop.is_set)
    time.sleep(0.2)
    assert got == [] and places.free == 1  # the one place is free, and stays for the rule's runs
    stop.set()
    places.wake()
    waiter.join(timeout=10)
    assert got == [False]


def _argv(tmp_path, *more: str) -> list[str]:
    return ["--points", "tiny@32", "--arms", "gpt", "ngpt", "--update-point", "", "--seeds", "0", "1", "2",
            "--jobs", "2", "--data", "stdlib", "--out", str(tmp_path / "out"), "--results", str(tmp_path / "results"),
            "--no-progress", *more]  # fmt: skip # a command line


def test_seed_runs_go_ahead_while_the_sweep_grows_and_the_rule_decides_the_same(scaling, tmp_path, monkeypatch):
    """nGPT's sweep grows twice past its grid (its best rate, 0.3, lies above it). While the first
    growth run trains, the other place trains a seed run of the best rate so far (0.1), one the
    rule will not need; the picks and the seed runs at the picked rates are those of the study
    without ``--ahead``, and no run trains twice."""
    calls: list = []
    fake = fake_train_one(calls)
    went_ahead = threading.Event()
    overlapped: list[bool] = []

    def train_one(pargs, spec, seed, say):
        name = spec.partition(":")[0]
        if name == "ngpt_lr1e-1" and seed == 1:  # the grid's best rate, on the first other seed
            went_ahead.set()
        elif name == "ngpt_lr3e-1" and seed == 0:  # the first growth run
            overlapped.append(went_ahead.wait(timeout=10))
        return fake(pargs, spec, seed, say)

    monkeypatch.setattr(scaling.convergence, "train_one", train_one)
    assert scaling.main(_argv(tmp_path, "--ahead")) == 0
    assert overlapped == [True]
    assert len(calls) == len(set(calls)), calls  # none twice
    rows = [json.loads(line) for line in (tmp_path / "results" / "runs.jsonl").read_text().splitlines()]
    assert len(rows) == len(calls)
    ahead = {(r["arm"], r["lr"], r["seed"]) for r in rows if r["seed"] != 0 and r["lr"] != BEST[r["arm"]]}
    assert ("ngpt", 0.1, 1) in ahead  # went ahead, unused: the rule picks 0.3
    picks = [json.loads(line) for line in (tmp_path / "results" / "picks.jsonl").read_text().splitlines()]
    assert {p["arm"]: p["picked"] for p in picks} == BEST

    calls_without: list = []
    monkeypatch.setattr(scaling.convergence, "train_one", fake_train_one(calls_without))
    plain = tmp_path / "plain"
    assert scaling.main(_argv(plain)) == 0
    picks_without = [json.loads(line) for line in (plain / "results" / "picks.jsonl").read_text().splitlines()]
    assert {p["arm"]: p["picked"] for p in picks_without} == BEST
    assert set(calls_without) <= set(calls)  # what the rule ran, and maybe more
    assert not any(c[3] != 0 and c[2] != BEST[c[1]] for c in calls_without)  # nothing ahead without --ahead


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_without_ahead_or_with_one_place_only_the_rules_runs_train(scaling, tmp_path, monkeypatch, jobs):
    calls: list = []
    monkeypatch.setattr(scaling.convergence, "train_one", fake_train_one(calls))
    more = ["--jobs", jobs] + (["--ahead"] if jobs == "1" else [])
    assert scaling.main(_argv(tmp_path, *more)) == 0
    assert len(calls) == 3 + 5 + 2 * 2, calls  # the sweeps, and each pick on seeds 1 and 2
