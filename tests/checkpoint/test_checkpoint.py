"""Single-process tests of spherenet.checkpoint: round trip, exact resume, atomicity,
corruption fallback, retention, NaN refusal, model mismatch."""

from __future__ import annotations

import json
import random
import shutil
import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import spherenet.checkpoint.manager as ckpt
from spherenet.checkpoint import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointManager,
    CheckpointMismatchError,
    CheckpointWarning,
    NonFiniteStateError,
    holds_checkpoints,
)


def make(hidden: int = 8, extra_layer: bool = False):
    layers = [nn.Linear(6, hidden), nn.ReLU(), nn.Dropout(0.25), nn.Linear(hidden, 3)]
    if extra_layer:
        layers.append(nn.Linear(3, 3))
    model = nn.Sequential(*layers)
    model.register_buffer("seen", torch.zeros(()))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    return model, opt, sched


def train_step(model, opt, sched):
    # Draws from every RNG the checkpoint restores: torch (data, dropout), python, numpy.
    x, y = torch.randn(5, 6), torch.randn(5, 3)
    scale = 1.0 + random.random() + float(np.random.rand())
    loss = ((model(x) - y) ** 2).mean() * scale
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    model.seen += 1


def seed_all(seed: int):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def state_of(model, opt, sched, **values):
    return {"model": model, "optimizer": opt, "scheduler": sched, **values}


def flat(tree, prefix=""):
    """Every leaf of a nested state dict, keyed by path."""
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flat(v, f"{prefix}.{k}"))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(flat(v, f"{prefix}.{i}"))
    else:
        out[prefix] = tree
    return out


def assert_same(a, b):
    fa, fb = flat(a), flat(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        if isinstance(fa[k], torch.Tensor):
            assert torch.equal(fa[k], fb[k]), k
        else:
            assert fa[k] == fb[k], k


def saved_run(tmp_path, steps=(10,), keep_last=3):
    """Train and save at each of ``steps``; returns the manager and a snapshot per step."""
    seed_all(0)
    model, opt, sched = make()
    mgr = CheckpointManager(tmp_path / "ckpt", keep_last=keep_last)
    snaps, done = {}, 0
    for s in steps:
        while done < s:
            train_step(model, opt, sched)
            done += 1
        mgr.save(s, state_of(model, opt, sched, data={"batch": s}, config={"lr": 1e-2, "name": "tiny"}))
        snaps[s] = {k: v.clone() for k, v in model.state_dict().items()}
    return mgr, snaps, (model, opt, sched)


# ------------------------------------------------------------------------------ round trip


def test_round_trip_restores_everything_exactly(tmp_path):
    mgr, snaps, (model, opt, sched) = saved_run(tmp_path)
    rng_after_save = torch.get_rng_state()

    seed_all(99)
    m2, o2, s2 = make()
    assert not torch.equal(m2[0].weight, model[0].weight)
    ck = mgr.load_latest(state_of(m2, o2, s2))

    assert ck.step == 10 and ck.path == tmp_path / "ckpt" / "step_00000010"
    assert ck.extra == {"data": {"batch": 10}, "config": {"lr": 1e-2, "name": "tiny"}}
    assert_same(m2.state_dict(), model.state_dict())
    assert_same(o2.state_dict(), opt.state_dict())
    assert_same(s2.state_dict(), sched.state_dict())
    assert torch.equal(torch.get_rng_state(), rng_after_save)
    # the optimizer still drives the model's own tensors
    assert all(p is q for p, q in zip(o2.param_groups[0]["params"], m2.parameters()))
    manifest = json.loads((ck.path / "MANIFEST.json").read_text())
    assert manifest["step"] == 10 and manifest["backend"] == "torch"
    assert manifest["fingerprint"]["0.weight"] == [[8, 6], "torch.float32"]


def test_resume_equals_uninterrupted_run(tmp_path):
    seed_all(0)
    m, o, s = make()
    for _ in range(20):
        train_step(m, o, s)
    reference = ({k: v.clone() for k, v in m.state_dict().items()}, o.state_dict(), s.state_dict())

    def resumed(restore_rng: bool):
        seed_all(0)
        m1, o1, s1 = make()
        mgr = CheckpointManager(tmp_path / f"run{restore_rng}")
        for _ in range(10):
            train_step(m1, o1, s1)
        mgr.save(10, state_of(m1, o1, s1))
        seed_all(1234)  # the "new process": other RNG, other initial weights
        m2, o2, s2 = make()
        assert mgr.load_latest(state_of(m2, o2, s2), restore_rng=restore_rng).step == 10
        for _ in range(10):
            train_step(m2, o2, s2)
        return m2, o2, s2

    m2, o2, s2 = resumed(True)
    assert_same(m2.state_dict(), reference[0])  # bitwise
    assert_same(o2.state_dict(), reference[1])
    assert_same(s2.state_dict(), reference[2])
    # Control: the comparison above is sensitive to the RNG restore.
    m3, _, _ = resumed(False)
    assert not torch.equal(m3[0].weight, reference[0]["0.weight"])


def test_manifold_parameter_is_loaded_in_place(tmp_path):
    geoopt = pytest.importorskip("geoopt")
    from spherenet.manifolds import Sphere

    sphere = Sphere()

    def build(seed):
        torch.manual_seed(seed)
        mod = nn.Module()
        mod.w = geoopt.ManifoldParameter(sphere.random_point(4, 5), manifold=sphere)
        opt = geoopt.optim.RiemannianAdam(mod.parameters(), lr=1e-2)
        return mod, opt

    def step(mod, opt):
        loss = (mod.w @ torch.arange(5.0)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()

    mod, opt = build(0)
    step(mod, opt)
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, {"model": mod, "optimizer": opt})

    mod2, opt2 = build(1)
    w_obj = mod2.w
    mgr.load_latest({"model": mod2, "optimizer": opt2})
    assert mod2.w is w_obj and type(mod2.w) is geoopt.ManifoldParameter
    assert mod2.w.manifold is sphere or isinstance(mod2.w.manifold, geoopt.Sphere)
    assert torch.equal(mod2.w, mod.w)
    step(mod, opt)
    step(mod2, opt2)
    assert torch.equal(mod2.w, mod.w)  # the Riemannian optimizer continues identically
    sphere.assert_on_sphere(mod2.w.detach())


# ------------------------------------------------------------------------------ atomicity


class _Crash(BaseException):
    """Stands in for a kill: not an Exception, so save() runs no cleanup for it."""


def test_crash_mid_save_leaves_previous_checkpoint(tmp_path, monkeypatch):
    mgr, snaps, (model, opt, sched) = saved_run(tmp_path)
    train_step(model, opt, sched)

    def crash(tmp, manifest):
        assert (tmp / "state.pt").is_file()  # part of the checkpoint is on disk
        raise _Crash

    monkeypatch.setattr(ckpt, "_write_manifest", crash)
    with pytest.raises(_Crash):
        mgr.save(20, state_of(model, opt, sched))
    monkeypatch.undo()

    root = tmp_path / "ckpt"
    assert (root / ".tmp-step_00000020" / "state.pt").is_file()
    assert [s for s, _ in mgr.checkpoints()] == [10]
    m2, o2, s2 = make()
    assert mgr.load_latest(state_of(m2, o2, s2)).step == 10
    assert_same(m2.state_dict(), snaps[10])

    mgr.save(30, state_of(model, opt, sched))  # the next save cleans the leftover up
    assert not (root / ".tmp-step_00000020").exists()
    assert [s for s, _ in mgr.checkpoints()] == [10, 30]


def test_failed_save_raises_and_cleans_up(tmp_path, monkeypatch):
    mgr, snaps, (model, opt, sched) = saved_run(tmp_path)

    def disk_full(obj, path):
        path.write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "_torch_save_synced", disk_full)
    with pytest.raises(CheckpointError, match=r"no space left on device \(ENOSPC\)"):
        mgr.save(20, state_of(model, opt, sched))
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_00000010"]


def test_a_ctrl_c_inside_torch_save_reaches_the_caller_and_the_previous_checkpoint_stays(tmp_path, monkeypatch):
    """torch's zip writer turns an exception raised by the file's ``write`` into ``unexpected pos
    N vs M`` when it closes the zip; a Ctrl-C there is an abort (exit 130 in the trainer), not a
    failed save (exit 2)."""
    from spherenet.checkpoint import format as checkpoint_format

    mgr, snaps, (model, opt, sched) = saved_run(tmp_path)
    train_step(model, opt, sched)
    write, calls = checkpoint_format._Writer.write, []

    def interrupted_write(self, data):
        calls.append(len(data))
        if len(calls) == 5:
            raise KeyboardInterrupt
        return write(self, data)

    monkeypatch.setattr(checkpoint_format._Writer, "write", interrupted_write)
    with pytest.raises(KeyboardInterrupt):
        mgr.save(20, state_of(model, opt, sched))
    monkeypatch.undo()
    assert len(calls) >= 5 and [s for s, _ in mgr.checkpoints()] == [10]
    m2, o2, s2 = make()
    assert mgr.load_latest(state_of(m2, o2, s2)).step == 10
    assert_same(m2.state_dict(), snaps[10])


def test_a_zip_writer_finished_after_its_file_closed_does_not_abort_the_process(tmp_path):
    """A Ctrl-C right after torch made its zip writer and before the save used it: the writer is
    never finished, and its destructor writes the zip's end after the file is closed. An
    exception there is ``std::terminate`` (the process aborts, exit -6); the write is dropped."""
    import subprocess

    script = f"""
import gc, torch, torch.serialization as serialization
from pathlib import Path
from spherenet.checkpoint.format import _torch_save_synced

def interrupted(self):
    raise KeyboardInterrupt
serialization._opener.__enter__ = interrupted
try:
    _torch_save_synced({{"x": torch.zeros(10)}}, Path({str(tmp_path / "state.pt")!r}))
except KeyboardInterrupt:
    print("interrupted", flush=True)
gc.collect()
print("went on", flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.splitlines() == ["interrupted", "went on"], done.stderr[-2000:]


def test_torn_directory_is_skipped_with_warning(tmp_path):
    mgr, snaps, _ = saved_run(tmp_path, steps=(10, 20))
    torn = tmp_path / "ckpt" / "step_00000030"
    shutil.copytree(tmp_path / "ckpt" / "step_00000020", torn)
    (torn / "MANIFEST.json").unlink()

    m2, o2, s2 = make()
    with pytest.warns(CheckpointWarning, match=r"step_00000030 has no MANIFEST.json"):
        ck = mgr.load_latest(state_of(m2, o2, s2))
    assert ck.step == 20
    assert_same(m2.state_dict(), snaps[20])


# ------------------------------------------------------------------------------ corruption


def _flip_bytes(path, at=0.5, n=8):
    data = bytearray(path.read_bytes())
    i = int(len(data) * at)
    data[i : i + n] = bytes(b ^ 0xFF for b in data[i : i + n])
    path.write_bytes(bytes(data))


def test_flipped_bytes_detected_and_load_latest_falls_back(tmp_path):
    mgr, snaps, _ = saved_run(tmp_path, steps=(10, 20))
    newest = tmp_path / "ckpt" / "step_00000020"
    _flip_bytes(newest / "state.pt")

    m2, o2, s2 = make()
    with pytest.raises(CheckpointCorruptError, match=r"state.pt has sha256 .* manifest records"):
        mgr.load(newest, state_of(m2, o2, s2))
    with pytest.warns(CheckpointWarning, match=r"skipping damaged checkpoint.*step_00000020"):
        ck = mgr.load_latest(state_of(m2, o2, s2))
    assert ck.step == 10
    assert ck.extra["data"] == {"batch": 10}
    assert_same(m2.state_dict(), snaps[10])


def test_truncated_file_detected(tmp_path):
    mgr, _, _ = saved_run(tmp_path, steps=(10, 20))
    state = tmp_path / "ckpt" / "step_00000020" / "state.pt"
    state.write_bytes(state.read_bytes()[:100])
    m2, o2, s2 = make()
    with pytest.raises(CheckpointCorruptError, match=r"state.pt has 100 bytes but the manifest records \d+"):
        mgr.load(state.parent, state_of(m2, o2, s2))
    with pytest.warns(CheckpointWarning):
        assert mgr.load_latest(state_of(m2, o2, s2)).step == 10


def test_garbled_manifest_and_all_damaged(tmp_path):
    mgr, _, _ = saved_run(tmp_path, steps=(10, 20))
    root = tmp_path / "ckpt"
    (root / "step_00000020" / "MANIFEST.json").write_text('{"format": "spherenet-checkp')
    m2, o2, s2 = make()
    with pytest.raises(CheckpointCorruptError, match="MANIFEST.json is unreadable"):
        mgr.load(root / "step_00000020", state_of(m2, o2, s2))
    (root / "step_00000010" / "state.pt").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        with pytest.raises(CheckpointCorruptError, match=r"every checkpoint .* is damaged(.|\n)*state.pt is missing"):
            mgr.load_latest(state_of(m2, o2, s2))


def test_resave_replaces_damaged_step(tmp_path):
    mgr, _, (model, opt, sched) = saved_run(tmp_path, steps=(10, 20))
    _flip_bytes(tmp_path / "ckpt" / "step_00000020" / "state.pt")
    with pytest.warns(CheckpointWarning):
        mgr.load_latest(state_of(model, opt, sched))
    for _ in range(10):
        train_step(model, opt, sched)
    mgr.save(20, state_of(model, opt, sched))
    m2, o2, s2 = make()
    assert mgr.load_latest(state_of(m2, o2, s2)).step == 20  # no warning needed now
    assert_same(m2.state_dict(), model.state_dict())
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".")]


def test_no_checkpoint_returns_none(tmp_path):
    m, o, s = make()
    assert CheckpointManager(tmp_path / "absent").load_latest(state_of(m, o, s)) is None


# ------------------------------------------------------------------------------ retention


def test_keep_last_prunes_only_after_new_one(tmp_path, monkeypatch):
    mgr, _, (model, opt, sched) = saved_run(tmp_path, steps=(1, 2, 3, 4, 5), keep_last=2)
    assert [s for s, _ in mgr.checkpoints()] == [4, 5]

    # The new checkpoint must be in place when pruning starts.
    seen = []
    real_prune = CheckpointManager._prune

    def spy(self, step, final):
        seen.append((final / "MANIFEST.json").is_file())
        real_prune(self, step, final)

    monkeypatch.setattr(CheckpointManager, "_prune", spy)
    mgr.save(6, state_of(model, opt, sched))
    assert seen == [True]
    assert [s for s, _ in mgr.checkpoints()] == [5, 6]


@pytest.mark.skipif(sys.platform == "win32", reason="pins are flock locks: POSIX only")
def test_pruning_passes_over_a_checkpoint_a_reader_holds(tmp_path):
    """A reader's verified checkpoint (an export beside a live run) survives the run's pruning
    until it is loaded; the next save after that prunes it."""
    mgr, snaps, (model, opt, sched) = saved_run(tmp_path, steps=(1,), keep_last=1)
    reader = CheckpointManager(tmp_path / "ckpt", keep_last=None)
    held = reader.latest_verified()
    assert held.step == 1
    mgr.save(2, state_of(model, opt, sched))
    mgr.save(3, state_of(model, opt, sched))
    assert [s for s, _ in mgr.checkpoints()] == [1, 3]  # 2 pruned, 1 pinned
    fresh, _, _ = make()
    reader.load(held, {"model": fresh}, restore_rng=False)  # readable, and released by load
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, snaps[1][name]), name
    mgr.save(4, state_of(model, opt, sched))
    assert [s for s, _ in mgr.checkpoints()] == [4]


def test_a_released_or_dropped_pin_lets_pruning_go_on(tmp_path):
    mgr, _, (model, opt, sched) = saved_run(tmp_path, steps=(1,), keep_last=1)
    held = mgr.verify(mgr.path_for(1))
    held.release()
    held.release()  # twice is harmless
    mgr.save(2, state_of(model, opt, sched))
    assert [s for s, _ in mgr.checkpoints()] == [2]
    mgr.verify(mgr.path_for(2))  # dropped at once: nothing holds it
    mgr.save(3, state_of(model, opt, sched))
    assert [s for s, _ in mgr.checkpoints()] == [3]


@pytest.mark.skipif(sys.platform == "win32", reason="pins are flock locks: POSIX only")
def test_without_flock_pruning_and_reading_go_on_unpinned(tmp_path, monkeypatch):
    """A filesystem that refuses flock (ENOLCK on some network mounts) must not stop pruning."""
    import errno
    import fcntl

    def refuse(fd, op):
        raise OSError(errno.ENOLCK, "no locks available")

    mgr, _, (model, opt, sched) = saved_run(tmp_path, steps=(1,), keep_last=1)
    monkeypatch.setattr(fcntl, "flock", refuse)
    held = mgr.verify(mgr.path_for(1))
    assert held.step == 1
    mgr.save(2, state_of(model, opt, sched))
    assert [s for s, _ in mgr.checkpoints()] == [2]


def test_keep_all_and_validation(tmp_path):
    mgr, _, _ = saved_run(tmp_path, steps=(1, 2, 3, 4), keep_last=None)
    assert [s for s, _ in mgr.checkpoints()] == [1, 2, 3, 4]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="keep_last"):
            CheckpointManager(tmp_path, keep_last=bad)


def test_saving_below_newer_steps_keeps_new_one_and_warns(tmp_path):
    mgr, _, (model, opt, sched) = saved_run(tmp_path, steps=(10, 20, 30), keep_last=2)
    with pytest.warns(CheckpointWarning, match="load_latest\\(\\) will prefer them"):
        mgr.save(15, state_of(model, opt, sched))
    assert [s for s, _ in mgr.checkpoints()] == [15, 20, 30]


# ------------------------------------------------------------------------------ refusals


def test_refuses_nan_in_model(tmp_path):
    mgr, _, (model, opt, sched) = saved_run(tmp_path)
    with torch.no_grad():
        model[3].weight[1, 2] = float("nan")
    with pytest.raises(NonFiniteStateError, match=r"model\.3\.weight"):
        mgr.save(20, state_of(model, opt, sched))
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_00000010"]


def test_refuses_inf_in_optimizer(tmp_path):
    mgr, _, (model, opt, sched) = saved_run(tmp_path)
    opt.state[model[0].bias]["exp_avg_sq"][0] = float("inf")
    with pytest.raises(NonFiniteStateError, match=r"optimizer\.state\.1\.exp_avg_sq") as info:
        mgr.save(20, state_of(model, opt, sched))
    assert "model." not in str(info.value)
    assert [s for s, _ in mgr.checkpoints()] == [10]


def test_refuses_values_that_would_not_load(tmp_path):
    m, o, s = make()
    mgr = CheckpointManager(tmp_path)

    class Config:
        lr = 1.0

    with pytest.raises(TypeError, match=r"state\['config'\].*Config.*asdict"):
        mgr.save(1, state_of(m, o, s, config=Config()))
    assert mgr.checkpoints() == []


# ------------------------------------------------------------------------------ mismatch


def test_mismatched_model_names_the_keys(tmp_path):
    mgr, _, _ = saved_run(tmp_path, steps=(10, 20))
    wider, o2, s2 = make(hidden=16)
    with pytest.raises(CheckpointMismatchError) as info:
        mgr.load_latest(state_of(wider, o2, s2))  # no fallback: an older one would not fit either
    msg = str(info.value)
    assert "step_00000020" in msg
    assert "0.weight: (8, 6) float32 vs (16, 6) float32" in msg
    assert "3.weight: (3, 8) float32 vs (3, 16) float32" in msg
    assert "3.bias" not in msg  # same shape: not listed

    deeper, o3, s3 = make(extra_layer=True)
    with pytest.raises(CheckpointMismatchError, match=r"in the model but not in the checkpoint:\n    4.bias: \(3,\)"):
        mgr.load_latest(state_of(deeper, o3, s3))


def test_missing_stateful_or_optimizer_is_a_mismatch(tmp_path):
    m, o, s = make()
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, {"model": m})
    with pytest.raises(CheckpointMismatchError, match="no optimizer state"):
        mgr.load_latest({"model": m, "optimizer": o})
    with pytest.raises(CheckpointMismatchError, match=r"no state for \['scheduler'\]"):
        mgr.load_latest({"model": m, "scheduler": s})
    assert mgr.load_latest({"model": m}).step == 1


# ------------------------------------------------------------------------------ what holds a run


def test_holds_checkpoints_names_a_checkpoint_a_folder_of_them_and_a_runs_checkpoints_folder(tmp_path):
    mgr, _, _ = saved_run(tmp_path, steps=(2,))
    assert holds_checkpoints(mgr.directory / "step_00000002") == "a checkpoint (MANIFEST.json)"
    assert holds_checkpoints(mgr.directory) == "step_* checkpoints"
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)  # a run's folder, before its first checkpoint
    assert holds_checkpoints(tmp_path / "run") == "checkpoints"
    # Names alone do not make a run: an empty step_ folder, one without a step number, a missing path.
    (tmp_path / "other" / "step_00000001").mkdir(parents=True)
    (tmp_path / "other" / "step_final").mkdir()
    (tmp_path / "other" / "step_final" / "MANIFEST.json").write_text("{}")
    assert holds_checkpoints(tmp_path / "other") is None
    assert holds_checkpoints(tmp_path / "other" / "step_final") is None
    assert holds_checkpoints(tmp_path / "absent") is None


def test_an_extra_file_is_read_as_verified_or_refused(tmp_path):
    """read_file hands out only the bytes the manifest records: a file altered after verification
    (same size, other bytes) is refused by name; files_under lists a folder's files."""
    model = nn.Linear(2, 2)
    mgr = CheckpointManager(tmp_path / "ckpt")
    files = {"tokenizer/spec.json": '{"kind": "byte"}', "tokenizer/tokenizer.json": "{}", "notes.txt": "x"}
    mgr.save(1, {"model": model}, files=files)
    verified = mgr.verify(tmp_path / "ckpt" / "step_00000001")
    try:
        assert verified.files_under("tokenizer") == ["tokenizer/spec.json", "tokenizer/tokenizer.json"]
        assert verified.read_file("tokenizer/spec.json") == b'{"kind": "byte"}'
        (verified.path / "tokenizer" / "spec.json").write_text('{"kind": "bpe!"}')  # same size
        with pytest.raises(
            CheckpointCorruptError, match=r"tokenizer/spec.json changed after the checkpoint was verified"
        ):
            verified.read_file("tokenizer/spec.json")
        with pytest.raises(CheckpointError, match=r"has no file 'missing.txt'"):
            verified.read_file("missing.txt")
    finally:
        verified.release()
