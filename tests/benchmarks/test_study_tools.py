"""The tools that run many trainings (recipes.compare, benchmarks/convergence.py) behave like
the trainer: overrides parsed the same way and passed to every run, results labelled with the
data they used, and their training processes stop with them on SIGTERM / Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from signals import process_state

from recipes import compare

ROOT = Path(__file__).resolve().parents[2]
CONVERGENCE = ROOT / "benchmarks" / "convergence.py"


@pytest.fixture(scope="module")
def lines_corpus(tmp_path_factory):
    """A plain text file without blank lines: one document unless data.text_unit=line."""
    path = tmp_path_factory.mktemp("study") / "ballads.txt"
    path.write_text("\n".join(f"verse {i}: the quick brown fox jumps over the lazy dog {i % 5}" for i in range(400)))
    return path


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))


# --- overrides --------------------------------------------------------------------------------


def test_overrides_anywhere_on_the_command_line(convergence):
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--variants", nargs="+", default=["gpt"])
    compare.add_override_argument(p, "overrides")
    args = compare.parse_args_with_overrides(
        p, ["--seeds", "0", "1", "train.steps=5", "--variants", "gpt", "big:model.n_layers=3", "optim.lr=1e-3"]
    )
    assert args.seeds == [0, 1]
    assert args.variants == ["gpt", "big:model.n_layers=3"]  # a variant spec is not an override
    assert args.overrides == ["train.steps=5", "optim.lr=1e-3"]


@pytest.mark.parametrize("tool", ["compare", "convergence"])
def test_bad_override_stops_before_the_first_run(tool, convergence, tmp_path, capsys, lines_corpus):
    argv = ["--variants", "gpt", "--seeds", "0", "--out", str(tmp_path), "train.stepz=5"]
    main = compare.main if tool == "compare" else convergence.main
    if tool == "convergence":
        argv += ["--data", str(lines_corpus), "--lrs", "1e-2"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "unknown config key train.stepz" in capsys.readouterr().err  # the trainer's message
    assert not (tmp_path / "gpt").exists() and not (tmp_path / "runs" / "gpt_lr1e-2").exists()


def test_corpus_label_comes_from_the_data(convergence, lines_corpus):
    assert convergence.corpus_label(str(lines_corpus)) == f"{lines_corpus.parent.name}/ballads.txt"
    assert convergence.corpus_label("hf:HuggingFaceFW/fineweb-edu") == "HuggingFaceFW/fineweb-edu"
    assert convergence.corpus_label("stdlib").startswith("default corpus")
    assert "tinyshakespeare" not in convergence.corpus_label(str(lines_corpus))


@pytest.mark.slow  # two training processes (~30 s on 2 shared cores)
def test_convergence_labels_its_data_and_passes_overrides_to_every_run(tmp_path, lines_corpus):
    out = tmp_path / "study"
    cmd = [sys.executable, str(CONVERGENCE), "--variants", "gpt", "ngpt", "--lrs", "1e-2",
           "--seeds", "0", "--steps", "4", "--eval-every", "2", "--eval-batches", "1", "--block", "16", "--batch", "4",
           "--data", str(lines_corpus), "--out", str(out), "--results", str(out / "results"), "--jobs", "2",
           # after a list option, where argparse alone would read them as learning rates:
           "--ngpt-lrs", "1e-2", "data.text_unit=line", "model.max_seq_len=16"]  # fmt: skip  # options beside their values
    done = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for run in ("gpt_lr1e-2", "ngpt_lr1e-2"):
        start = json.loads((out / "runs" / run / "seed0" / "metrics.jsonl").read_text().splitlines()[0])
        assert start["config"]["data"]["text_unit"] == "line"
        assert start["config"]["model"]["max_seq_len"] == 16
    report = (out / "results" / "convergence.md").read_text()
    assert f"Data: {lines_corpus.parent.name}/ballads.txt" in report
    assert "tinyshakespeare" not in report
    assert "data.text_unit=line" in report  # the header names the overrides


# --- signals ------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    return process_state(pid) not in ("Z", "")  # a zombie has stopped; only its exit status is left


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _stop_tool_and_check_children(
    cmd: list[str], cwd: Path, sig: int, child_marker: str, ready_timeout: float, settle_s: float = 0.0, ready=None
) -> float:
    """Start ``cmd``, wait for a child whose command line has ``child_marker`` (then for
    ``ready()``, then ``settle_s``), send ``sig`` to the tool, and check that the tool and that
    child are both gone within a few seconds. Returns the seconds from the signal to the tool's exit."""
    tool = subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    child = None
    try:
        child = _wait_for(
            lambda: next((c for c in _children(tool.pid) if child_marker in _cmdline(c)), None),
            ready_timeout,
            f"a child running {child_marker}",
        )
        if ready is not None:
            _wait_for(ready, ready_timeout, "the child to be ready")
        time.sleep(settle_s)
        sent = time.monotonic()
        tool.send_signal(sig)
        rc = tool.wait(timeout=30)
        took = time.monotonic() - sent
        err = tool.stderr.read()
        assert rc == 128 + sig, (rc, err[-2000:])
        assert f"stopped by {signal.Signals(sig).name}" in err
        _wait_for(lambda: not _alive(child), 5, f"child {child} to stop")
        return took
    finally:
        for pid in (child, tool.pid):
            if pid is not None and _alive(pid):
                os.kill(pid, signal.SIGKILL)
        tool.wait()


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")


@needs_proc
def test_signal_is_forwarded_then_a_stubborn_child_is_killed(tmp_path):
    """The helper alone: a child that ignores SIGTERM is killed after the grace period, and
    Ctrl-C (SIGINT) is forwarded to a child's whole process group."""
    script = tmp_path / "tool.py"
    script.write_text(
        textwrap.dedent("""
        import sys
        from recipes import subprocesses

        stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
        code = sys.argv[1] if len(sys.argv) > 1 else stubborn
        with subprocesses.stop_children_on_signals(grace_s=1.0):
            subprocesses.run([sys.executable, "-c", code])
    """)
    )
    took = _stop_tool_and_check_children([sys.executable, str(script)], tmp_path, signal.SIGTERM, "-c", 20, 1.5)
    assert 1.0 <= took < 10  # waited the grace period, then killed it
    # A grandchild in the child's process group gets the forwarded SIGINT as well.
    parent_of_sleeper = "import subprocess, sys; subprocess.run(['sleep', '120'])"
    _stop_tool_and_check_children([sys.executable, str(script), parent_of_sleeper], tmp_path, signal.SIGINT, "-c", 20)


@needs_proc
@pytest.mark.slow  # imports torch twice (the tool and its training child), ~15 s
def test_sigterm_to_compare_stops_its_training_run(tmp_path, lines_corpus):
    cmd = [sys.executable, "-m", "recipes.compare", "--variants", "ngpt", "--size", "tiny", "--out", str(tmp_path / "c"),
           "train.steps=100000", f"data.source={lines_corpus}", "data.text_unit=line",
           f"data.cache_dir={tmp_path / 'cache'}", "train.checkpoint_every=100000"]  # fmt: skip  # options beside their values
    metrics = tmp_path / "c" / "ngpt" / "seed0" / "metrics.jsonl"
    training = lambda: metrics.is_file() and '"event": "start"' in metrics.read_text()  # noqa: E731
    _stop_tool_and_check_children(cmd, tmp_path, signal.SIGTERM, "recipes.train", 120, ready=training)
    # The run got the forwarded SIGTERM while training: it stopped cleanly with a checkpoint.
    assert '"event": "halted"' in metrics.read_text()
    assert list((tmp_path / "c" / "ngpt" / "seed0" / "checkpoints").glob("step_*"))


@needs_proc
@pytest.mark.slow  # imports torch twice (the tool and its training child), ~15 s
def test_sigterm_to_convergence_stops_its_training_runs(tmp_path, lines_corpus):
    cmd = [sys.executable, str(CONVERGENCE), "--variants", "gpt", "--lrs", "1e-2", "--seeds", "0",
           "--steps", "100000", "--data", str(lines_corpus), "--out", str(tmp_path / "study"), "--jobs", "1",
           "data.text_unit=line"]  # fmt: skip  # options beside their values
    _stop_tool_and_check_children(cmd, tmp_path, signal.SIGTERM, "recipes.train", 120)


def test_text_without_blank_lines_hints_at_a_key_the_trainer_takes(lines_corpus, tmp_path):
    from spherenet.data import DataError, prepare_dataset
    from spherenet.train.config import ConfigError, load_config

    with pytest.raises(DataError, match="data.text_unit=line"):
        prepare_dataset(str(lines_corpus), "byte", tmp_path / "cache")
    assert load_config(None, ["data.text_unit=line"]).data.text_unit == "line"
    with pytest.raises(ConfigError, match="data.text_unit"):
        load_config(None, ["data.text_unit=sentence"])
    data = prepare_dataset(str(lines_corpus), "byte", tmp_path / "cache", text_unit="line")
    assert data.num_tokens("val") > 0
