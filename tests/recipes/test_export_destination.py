"""``recipes.export --overwrite`` replaces an earlier export and nothing else: never a run, a
part of one, a directory a live trainer holds, or one that contains the source; a live run's
checkpoint pruned while it is read is replaced by the newest remaining one; a killed export's
leftovers are removed by the next."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys

import pytest

from recipes import checkpoints as checkpoints_module
from recipes import export
from recipes.checkpoints import load_trained
from recipes.train import cli as train_cli


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished three-step nGPT run (checkpoints at 1, 2, 3), byte tokenizer."""
    root = tmp_path_factory.mktemp("export_destination")
    (root / "c.txt").write_text("\n\n".join(f"line {i}: the quick brown fox {i % 7}" for i in range(200)))
    out = root / "run"
    rc = train_cli(
        [
            "model.preset=ngpt-tiny",
            "model.max_seq_len=32",
            "train.batch_size=4",
            "train.eval_every=3",
            "train.eval_batches=1",
            "train.sample_tokens=0",
            "train.progress=false",
            "train.steps=3",
            "train.checkpoint_every=1",
            f"train.out_dir={out}",
            f"data.source={root / 'c.txt'}",
            f"data.cache_dir={root / 'cache'}",
        ]
    )
    assert rc == 0
    return out


def snapshot(directory):
    """Every file under ``directory`` with its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture
def copy_of_run(run, tmp_path):
    """A private copy of the finished run (the tests try to damage it)."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


@pytest.mark.parametrize(
    "out_of",
    [lambda r: r, lambda r: r / "checkpoints", lambda r: r / "checkpoints" / "step_00000003", lambda r: r.parent],
    ids=["the_run", "its_checkpoints", "one_checkpoint", "the_sources_parent"],
)
def test_overwrite_onto_a_run_is_refused_and_the_run_is_untouched(copy_of_run, capsys, out_of):
    out = out_of(copy_of_run)
    before = snapshot(copy_of_run)
    assert export.main([str(copy_of_run), str(out), "--overwrite"]) == 2
    line = one_error(capsys)
    assert "--overwrite" in line and str(out) in line, line
    assert snapshot(copy_of_run) == before  # checkpoints, metrics.jsonl and train.lock all there


def test_overwrite_inside_a_run_is_refused(run, copy_of_run, tmp_path, capsys):
    inside = copy_of_run / "hf"
    assert export.main([str(run), str(tmp_path / "hf")]) == 0
    shutil.move(tmp_path / "hf", inside)  # an export put inside a run by hand
    capsys.readouterr()
    before = snapshot(copy_of_run)
    assert export.main([str(copy_of_run), str(inside), "--overwrite"]) == 2
    assert f"is inside a training run ({copy_of_run}: checkpoints up to step_00000003)" in one_error(capsys)
    assert snapshot(copy_of_run) == before


@pytest.mark.parametrize(
    "into",
    [lambda r: r / "checkpoints" / "step_99999999", lambda r: r / "hf", lambda r: r / "checkpoints" / "a" / "b"],
    ids=["a_new_step", "a_new_folder", "a_new_folder_among_checkpoints"],
)
@pytest.mark.parametrize("source", ["itself", "another_run"])
def test_an_export_into_a_new_directory_inside_a_run_is_refused(run, copy_of_run, capsys, into, source):
    """Without --overwrite too: an export inside a run would be read as part of it (a new
    ``step_*`` as a damaged checkpoint at every later resume, export and sample)."""
    out = into(copy_of_run)
    before, paths = snapshot(copy_of_run), sorted(copy_of_run.rglob("*"))
    assert export.main([str(copy_of_run if source == "itself" else run), str(out)]) == 2
    line = one_error(capsys)
    assert line.startswith(f"error: {out} is inside a training run ({copy_of_run}") and line.endswith(
        "export elsewhere"
    )
    assert "--overwrite" not in line
    assert snapshot(copy_of_run) == before and sorted(copy_of_run.rglob("*")) == paths  # not even a folder made


def test_an_export_beside_a_projects_own_checkpoints_folder_is_accepted(run, tmp_path):
    """A ``checkpoints/`` folder of another tool (no ``step_*`` checkpoints in it) above OUT is
    no training run: many projects keep one."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "model.ckpt").write_bytes(b"another tool's")
    out = tmp_path / "exported" / "ngpt"
    assert export.main([str(run), str(out)]) == 0
    assert export.main([str(run), str(out), "--overwrite"]) == 0


def test_overwrite_into_a_directory_a_live_trainer_holds_is_refused(run, tmp_path, capsys):
    """A trainer holds ``train.lock`` (an exclusive ``flock``, as ``recipes.train`` takes it)."""
    live = tmp_path / "live"
    live.mkdir()
    (live / "notes.txt").write_text("the trainer's")
    with (live / "train.lock").open("a+") as lock:
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        lock.flush()
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert export.main([str(run), str(live), "--overwrite"]) == 2
        line = one_error(capsys)
    assert f"is in use by a live trainer (pid {os.getpid()} on" in line, line
    assert (live / "notes.txt").read_text() == "the trainer's"


def test_overwrite_replaces_an_earlier_export_and_nothing_else(run, tmp_path, capsys):
    out = tmp_path / "exported"
    assert export.main([str(run), str(out), "--step", "1"]) == 0
    first = snapshot(out)
    assert export.main([str(run), str(out), "--overwrite"]) == 0  # step 3 replaces step 1
    assert snapshot(out) != first and set(snapshot(out)) == set(first)
    capsys.readouterr()

    (out / "sub").mkdir()
    (out / "sub" / "mine.txt").write_text("a user's file")
    assert export.main([str(run), str(out), "--overwrite"]) == 2
    assert "holds sub/mine.txt, which no export wrote" in one_error(capsys)
    assert (out / "sub" / "mine.txt").read_text() == "a user's file"

    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "data.bin").write_bytes(b"\x00" * 8)
    assert export.main([str(run), str(plain), "--overwrite"]) == 2
    assert "is not an earlier export (no sha256sums.json)" in one_error(capsys)
    assert (plain / "data.bin").read_bytes() == b"\x00" * 8


@pytest.mark.parametrize("edited", ["README.md", "config.json"])
def test_overwrite_keeps_an_export_file_the_user_edited(run, tmp_path, capsys, edited):
    """A file whose sha256 no longer matches the manifest is the user's now: --overwrite stops,
    naming it and the two ways on, and touches nothing; once it is moved away the export runs."""
    out = tmp_path / "exported"
    assert export.main([str(run), str(out), "--step", "1"]) == 0
    text = (out / edited).read_text()
    (out / edited).write_text(text.replace("1", "2", 1) if edited == "config.json" else text + "\nMy notes.\n")
    before = snapshot(out)
    capsys.readouterr()
    assert export.main([str(run), str(out), "--overwrite"]) == 2
    line = one_error(capsys)
    assert f"{out / edited} was changed after it was exported" in line, line
    assert "move it out of" in line and "delete it" in line, line
    assert snapshot(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["exported"]
    shutil.move(out / edited, tmp_path / f"my-{edited}")  # kept, out of the way
    assert export.main([str(run), str(out), "--overwrite"]) == 0
    assert (out / edited).read_text() != (tmp_path / f"my-{edited}").read_text()


def test_a_killed_exports_leftovers_are_removed_by_the_next(run, tmp_path):
    """A dead process's ``.tmp-export-*`` / ``.old-export-*`` beside OUT go; a live one's stay."""
    out = tmp_path / "exported"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    host = socket.gethostname()
    stale = [
        tmp_path / f".tmp-export-exported-{host}-{dead_pid}-0a1b2c3d",
        tmp_path / f".old-export-exported-{host}-{dead_pid}-0a1b2c3e",
    ]
    alive = tmp_path / f".tmp-export-exported-{host}-{os.getpid()}-0a1b2c3f"
    for d in [*stale, alive]:
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"half")
    assert export.main([str(run), str(out)]) == 0
    assert not any(d.exists() for d in stale) and alive.is_dir()


def test_a_checkpoint_pruned_while_it_is_read_gives_the_newest_remaining(copy_of_run, monkeypatch):
    """A live run with ``train.keep_last=1`` deletes the checkpoint an export is reading once its
    next one is in place: the reader moves on instead of failing (and never says "write")."""
    newest = copy_of_run / "checkpoints" / "step_00000003"
    real = checkpoints_module._load_trained
    calls = []

    def pruned_under_the_reader(ckpt, device):
        calls.append(ckpt.step)
        if ckpt.path == newest:
            shutil.rmtree(newest)  # what the trainer's prune does while the file is read
            raise FileNotFoundError(2, "No such file or directory", str(newest / "state.pt"))
        return real(ckpt, device)

    monkeypatch.setattr(checkpoints_module, "_load_trained", pruned_under_the_reader)
    trained = load_trained(copy_of_run)
    assert calls == [3, 2] and trained.step == 2


def test_a_named_checkpoint_deleted_while_read_is_a_read_error(copy_of_run, monkeypatch, capsys, tmp_path):
    step = copy_of_run / "checkpoints" / "step_00000002"

    def deleted(ckpt, device):
        shutil.rmtree(ckpt.path)
        raise FileNotFoundError(2, "No such file or directory", str(ckpt.path / "state.pt"))

    monkeypatch.setattr(checkpoints_module, "_load_trained", deleted)
    assert export.main([str(copy_of_run), str(tmp_path / "out"), "--step", "2"]) == 2
    line = one_error(capsys)
    assert (
        line
        == f"error: cannot read {step}: it was deleted while it was read (a live run prunes its checkpoints to train.keep_last)"
    )
    assert "write" not in line
