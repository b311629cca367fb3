"""recipes.plot: the loss curves of several runs on one figure, from their metrics.jsonl."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from recipes import plot


def write_run(run_dir: Path, losses: list[float], val_every: int = 2, resumed_at: int | None = None) -> Path:
    """A metrics.jsonl as recipes.train writes it: a start event, one record per step (a
    validation loss every ``val_every`` steps), a done event. ``resumed_at``: the steps after it
    are logged twice, the second time 0.1 lower (a run resumed from an older checkpoint)."""
    run_dir.mkdir(parents=True)
    records = [{"event": "start", "step": 0, "params": 1000, "config": {"train": {"steps": len(losses)}}}]

    def step_records(shift: float) -> list[dict]:
        out = []
        for step, loss in enumerate(losses, 1):
            r = {
                "step": step,
                "loss": loss - shift,
                "lr": 1e-3,
                "grad_norm": 0.5,
                "skipped": False,
                "tokens": step * 256,
                "tok_per_s": 1000.0,
                "alpha_A_mean_abs": [0.05, 0.07],
            }
            if step % val_every == 0:
                r["val_loss"] = loss + 0.1 - shift
            out.append(r)
        return out

    records += step_records(0.0)
    if resumed_at is not None:
        records += [r for r in step_records(0.1) if r["step"] > resumed_at]
    records.append({"event": "done", "step": len(losses), "val_loss": 99.0, "sphere_norm_error": 1e-7})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def is_png(path: Path) -> bool:
    import matplotlib.image

    head = path.read_bytes()[:8]
    image = matplotlib.image.imread(path)  # decodes the whole image
    return head == b"\x89PNG\r\n\x1a\n" and image.shape[0] > 100 and image.shape[1] > 100


def test_two_runs_on_one_figure(tmp_path, capsys):
    gpt = write_run(tmp_path / "gpt", [5.0, 4.0, 3.5, 3.2, 3.0, 2.9])
    ngpt = write_run(tmp_path / "ngpt", [5.0, 3.8, 3.2, 2.9, 2.7, 2.6], resumed_at=4)
    out = tmp_path / "figs" / "curves.png"
    assert plot.main([str(gpt), str(ngpt / "metrics.jsonl"), "--out", str(out)]) == 0
    assert is_png(out)
    assert f"wrote {out}" in capsys.readouterr().out


def test_series_takes_the_last_value_of_a_step_and_skips_events_and_gaps(tmp_path):
    ngpt = write_run(tmp_path / "ngpt", [5.0, 3.8, 3.2, 2.9, 2.7, 2.6], resumed_at=4)
    records = plot.read_metrics(ngpt / "metrics.jsonl")
    steps, loss = plot.series(records, "loss")
    assert steps == [1, 2, 3, 4, 5, 6]
    assert loss == pytest.approx([5.0, 3.8, 3.2, 2.9, 2.6, 2.5])  # steps 5, 6 as logged after the resume
    steps, val = plot.series(records, "val_loss", x="tokens")
    assert steps == [512, 1024, 1536] and 99.0 not in val  # the "done" event is not a step
    _, alpha = plot.series(records, "alpha_A_mean_abs")
    assert alpha == pytest.approx([0.06] * 6)  # mean over layers


def test_other_metrics_and_token_axis(tmp_path):
    run = write_run(tmp_path / "run", [4.0, 3.0, 2.5, 2.0])
    out = tmp_path / "lr.png"
    assert (
        plot.main([str(run), "--metric", "lr", "grad_norm", "alpha_A_mean_abs", "--x", "tokens", "--out", str(out)])
        == 0
    )
    assert is_png(out)


def test_labels_name_the_run_directories_and_tell_equal_names_apart(tmp_path):
    a, b = tmp_path / "gpt" / "seed0", tmp_path / "ngpt" / "seed0"
    assert plot.run_labels([str(a), str(b), str(tmp_path / "ngpt")]) == ["gpt/seed0", "ngpt/seed0", "ngpt"]


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda d: d.mkdir(), "has no metrics.jsonl"),
        (lambda d: None, "no such run directory"),
    ],
    ids=["no-metrics", "missing-dir"],
)
def test_a_run_without_metrics_is_a_clear_error(tmp_path, capsys, make, needle):
    good = write_run(tmp_path / "good", [4.0, 3.0])
    bad = tmp_path / "empty"
    make(bad)
    out = tmp_path / "x.png"
    assert plot.main([str(good), str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and str(bad) in err and "Traceback" not in err
    assert not out.exists()


def test_a_metric_no_run_logged_is_a_clear_error(tmp_path, capsys):
    run = write_run(tmp_path / "run", [4.0, 3.0])
    assert plot.main([str(run), "--metric", "perplexity", "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "'perplexity'" in err and "val_loss" in err  # names what the runs did log


def test_nonfinite_values_are_left_out(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": None, "skipped": True}, {"step": 3, "loss": 2.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    steps, loss = plot.series(plot.read_metrics(run / "metrics.jsonl"), "loss")
    assert steps == [1, 3] and all(math.isfinite(v) for v in loss)
