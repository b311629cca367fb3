"""recipes.resume: the resume policy on its own, without a training (the end-to-end resumes are
in test_recipe_train.py and test_faults.py). A checkpoint is stood in for by the few things the
policy reads from it: its path, step, manifest and saved state."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from recipes.resume import (
    RESUMABLE_CHANGES,
    _effective_model_config,
    check_data,
    check_resumable,
    extend_schedule,
    plan_resume,
    restore_position,
)
from spherenet.checkpoint import CheckpointError
from spherenet.data import DataError
from spherenet.optim import build_optimizer
from spherenet.train.config import ConfigError, load_config, resolved

TINY = ["model.preset=ngpt-tiny", "train.batch_size=8", "train.steps=20"]


def saved_values(cfg) -> dict:
    """What a run of ``cfg`` records in its checkpoints (as recipes.train does)."""
    model_class, model_config = _effective_model_config(cfg, 256)  # the byte vocabulary
    return {
        "config": resolved(cfg).to_dict(),
        "config_resolved": True,
        "model_class": model_class,
        "model_config": model_config,
    }


def checkpoint(cfg, step=10, world=1, backend="torch", batch=8, parallel="none"):
    values = saved_values(cfg)
    values["config"]["train"] = dict(values["config"]["train"], parallel=parallel)
    state = {"values": values, "stateful": {"train_windows": {"step": step, "batch_size": batch // world}}}
    return SimpleNamespace(
        path=Path("run/checkpoints/step_00000010"),
        step=step,
        manifest={"backend": backend, "world_size": world},
        read_state=lambda: state,
    )


def test_same_settings_resume_with_nothing_to_report():
    cfg = load_config(None, TINY)
    plan = plan_resume(checkpoint(cfg), cfg, world_size=1)
    assert plan.notes == [] and not plan.steps_changed and plan.data_position["step"] == 10


def test_an_accepted_change_passes_and_a_refused_one_is_named():
    cfg = load_config(None, TINY)
    assert "eval_every" in RESUMABLE_CHANGES["train"]
    saved = {"config": resolved(cfg).to_dict()}
    check_resumable(saved, load_config(None, [*TINY, "train.eval_every=7"]), "NGPT", {}, Path("x"))
    with pytest.raises(ConfigError) as info:
        check_resumable(saved, load_config(None, [*TINY, "optim.lr=0.5"]), "NGPT", {}, Path("x"))
    assert "optim.lr: 0.003 in the checkpoint, 0.5 now" in str(info.value)
    assert "start a new run in another train.out_dir" in str(info.value)


def test_a_setting_the_checkpoint_predates_counts_as_its_default():
    cfg = load_config(None, TINY)
    saved = {"config": resolved(cfg).to_dict()}
    del saved["config"]["data"]["format"]  # written before data.format existed
    check_resumable(saved, cfg, "NGPT", {}, Path("x"))
    with pytest.raises(ConfigError, match="data.format: '\\(unset\\)' in the checkpoint, 'text' now"):
        check_resumable(saved, load_config(None, [*TINY, "data.format=text"]), "NGPT", {}, Path("x"))


def test_a_model_change_is_named_field_by_field():
    cfg = load_config(None, TINY)
    saved = {
        "config": resolved(cfg).to_dict(),
        "model_class": "NGPT",
        "model_config": {"vocab_size": 256, "n_layers": 2},
    }
    with pytest.raises(ConfigError, match="model.n_layers: 2 in the checkpoint, 3 now"):
        check_resumable(saved, cfg, "NGPT", {"vocab_size": 256, "n_layers": 3}, Path("x"))
    with pytest.raises(ConfigError, match="model class: 'NGPT' in the checkpoint, 'GPT' now"):
        check_resumable(saved, cfg, "GPT", {"vocab_size": 256, "n_layers": 2}, Path("x"))


def test_more_steps_recompute_the_schedule_and_fewer_than_done_are_refused():
    cfg = load_config(None, TINY)
    longer = load_config(None, [*TINY, "train.steps=40"])
    plan = plan_resume(checkpoint(cfg), longer, world_size=1)
    assert plan.steps_changed and "train.steps 20 -> 40" in plan.notes[0]
    with pytest.raises(ConfigError, match="train.steps 5 is below the step of checkpoint"):
        plan_resume(checkpoint(cfg), load_config(None, [*TINY, "train.steps=5"]), world_size=1)


def test_layouts_an_unsharded_checkpoint_goes_anywhere_but_fsdp():
    cfg = load_config(None, [*TINY, "train.parallel=ddp"])
    plan = plan_resume(checkpoint(cfg, parallel="none"), cfg, world_size=2)
    assert "train.parallel none x 1 process(es) -> ddp x 2 process(es)" in plan.notes
    fsdp = load_config(None, [*TINY, "train.parallel=fsdp"])
    with pytest.raises(ConfigError, match="resuming it under FSDP .* is not supported"):
        plan_resume(checkpoint(cfg), fsdp, world_size=2)
    assert plan_resume(checkpoint(fsdp, backend="dcp", world=2, parallel="fsdp"), cfg, world_size=1).notes


def test_a_data_position_in_other_batches_is_refused():
    cfg = load_config(None, TINY)
    with pytest.raises(
        CheckpointError, match="counts its data position in batches of 4 windows, not global batches of 8"
    ):
        plan_resume(checkpoint(cfg, batch=4), cfg, world_size=1)


def test_a_checkpoint_without_a_data_position_is_refused():
    cfg = load_config(None, TINY)
    ckpt = checkpoint(cfg)
    del ckpt.read_state()["stateful"]["train_windows"]
    with pytest.raises(CheckpointError, match="holds no data position"):
        plan_resume(ckpt, cfg, world_size=1)


def test_restore_position_takes_the_saved_step_and_this_runs_batch():
    cfg = load_config(None, TINY)
    plan = plan_resume(checkpoint(cfg), cfg, world_size=1)
    seen = {}
    windows = SimpleNamespace(
        batch_size=4, world_size=2, load_state_dict=lambda s, strict: seen.update(s, strict=strict)
    )
    restore_position(windows, plan)
    assert seen == {"step": 10, "batch_size": 4, "strict": True}
    restore_position(windows, plan, data_changed=True)  # an accepted data change keeps only the step
    assert seen["strict"] is False


def test_the_windows_own_hint_is_replaced_by_the_clis():
    cfg = load_config(None, TINY)
    plan = plan_resume(checkpoint(cfg), cfg, world_size=1)

    def refuse(state, strict):
        raise DataError(
            "cannot resume x: saved num_tokens=5 but this loader has num_tokens=6 (pass strict=False to keep only the step)"
        )

    with pytest.raises(DataError) as info:
        restore_position(SimpleNamespace(batch_size=8, load_state_dict=refuse), plan)
    assert "strict" not in str(info.value) and "num_tokens=5" in str(info.value)
    assert "resume with the data it was trained on" in str(info.value)


def _other(value):
    """A value of the same type that differs from ``value``."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, list):
        return [*value, "other"]
    return f"{value}-other"


@pytest.mark.parametrize(
    "section,key", sorted((section, key) for section, keys in RESUMABLE_CHANGES.items() for key in keys)
)
def test_every_accepted_change_is_reported(section, key):
    cfg = load_config(None, TINY)
    ckpt = checkpoint(cfg)
    saved_cfg = ckpt.read_state()["values"]["config"]
    saved_cfg[section][key] = _other(saved_cfg[section][key])
    if (section, key) == ("train", "steps"):
        saved_cfg[section][key] = 30  # the new run's 20 is still past the checkpoint's step
    plan = plan_resume(ckpt, cfg, world_size=1)
    mine = [note for note in plan.notes if note.startswith(f"{section}.{key} ")]
    assert len(mine) == 1, plan.notes
    assert str(saved_cfg[section][key]) in mine[0]


@pytest.mark.parametrize(
    "saved,now",
    [
        ("train.block_size=0", "train.block_size=32"),  # 0 means the model's max_seq_len, 32 here
        ("optim.method=riemannian_adam", "optim.weight_decay=0"),  # unset: the method's default, 0 for nGPT
        ("optim.method=riemannian_adam", "optim.warmup_steps=0"),
        ("optim.method=adamw", "optim.weight_decay=0.1"),  # 0.1 and 2000 for GPT's methods
        ("optim.method=adamw", "optim.warmup_steps=2000"),
        ("optim.method=spherical_muon", "optim.muon_lr=0.003"),  # unset: optim.lr
        ("optim.method=adamh", "optim.matrix_lr=0.003"),
    ],
)
def test_equivalent_spellings_are_no_change(saved, now):
    """An unset key and the value it stands for, spelled out, are one setting, in either order."""
    method = [saved] if saved.startswith("optim.method") else []
    preset = ["model.preset=gpt-tiny"] if method and saved.split("=")[1] in ("adamw", "adamh") else []
    common = [*TINY, *preset, "model.max_seq_len=32", *method]
    given = load_config(None, common if method else [*common, saved])
    spelled = load_config(None, [*common, now])
    model_class, model_config = _effective_model_config(given, 256)
    for before, after in ((given, spelled), (spelled, given)):
        check_resumable(saved_values(before), after, model_class, model_config, Path("x"))
    key = now.split("=")[0]
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):  # a real change still is one
        check_resumable(
            saved_values(given), load_config(None, [*common, f"{key}=1"]), model_class, model_config, Path("x")
        )


def test_a_hyperball_run_resumes_with_its_matrix_rate_spelled_out():
    """adamh at optim.lr=0.01 resumed with optim.matrix_lr=0.01 (what the unset rate stands for)
    continues, as optim.muon_lr spelled out does for a Muon run."""
    gpt = ["model.preset=gpt-tiny", "train.batch_size=8", "train.steps=20", "optim.lr=0.01"]
    for method, key in (("adamh", "matrix_lr"), ("muon", "muon_lr")):
        run = load_config(None, [*gpt, f"optim.method={method}"])
        again = load_config(None, [*gpt, f"optim.method={method}", f"optim.{key}=0.01"])
        assert plan_resume(checkpoint(run), again, world_size=1).notes == []


def test_a_checkpoint_whose_config_is_not_resolved_is_refused_in_one_line():
    """A checkpoint from before unset keys were recorded resolved (its config spells them -1)."""
    cfg = load_config(None, TINY)
    ckpt = checkpoint(cfg)
    values = ckpt.read_state()["values"]
    del values["config_resolved"]
    values["config"]["optim"].update(weight_decay=-1.0, warmup_steps=-1, muon_lr=-1.0, matrix_lr=-1.0)
    with pytest.raises(CheckpointError) as info:
        plan_resume(ckpt, cfg, world_size=1)
    assert "\n" not in str(info.value) and "spells defaults as -1" in str(info.value)
    assert "start a new run" in str(info.value)


def test_a_halt_at_or_before_the_checkpoint_is_refused():
    cfg = load_config(None, [*TINY, "train.halt_after=10"])
    with pytest.raises(ConfigError, match=r"train.halt_after 10 is not after the step of checkpoint .* \(10\)"):
        plan_resume(checkpoint(cfg, step=10), cfg, world_size=1)
    later = load_config(None, [*TINY, "train.halt_after=15"])
    assert plan_resume(checkpoint(later, step=10), later, world_size=1).notes == []


def _data(content, files=("corpus.txt",)):
    verified = []
    return SimpleNamespace(
        meta={"content_sha256": content, "source": {"kind": "text", "files": list(files)}},
        verify=lambda: verified.append(True),
        file=lambda split: Path(f"cache/{split}.bin"),
        verified=verified,
    )


def test_data_with_other_content_is_refused_unless_the_change_is_named():
    cfg = load_config(None, TINY)
    ckpt = checkpoint(cfg)
    ckpt.read_state()["values"]["data_content_sha256"] = "a" * 64
    same = _data("a" * 64)
    assert check_data(plan_resume(ckpt, cfg, 1), same, accept_change=False) is False and same.verified
    edited = _data("b" * 64)
    with pytest.raises(DataError) as info:
        check_data(plan_resume(ckpt, cfg, 1), edited, accept_change=False)
    assert "corpus.txt now gives other tokens" in str(info.value) and "cache/train.bin" in str(info.value)
    assert "--accept-data-change" in str(info.value)
    plan = plan_resume(ckpt, cfg, 1)
    assert check_data(plan, edited, accept_change=True) is True
    assert plan.notes == [
        f"the data changed: corpus.txt (content sha256 {'a' * 12} in the checkpoint, {'b' * 12} "
        "now; token file cache/train.bin); the data position keeps only its step"
    ]
    moved = load_config(None, [*TINY, "data.source=other.txt"])  # another source: the same content is no change
    plan = plan_resume(ckpt, moved, 1)
    assert check_data(plan, same, accept_change=False) is False
    assert [n for n in plan.notes if n.startswith("data.source ")] == ["data.source 'stdlib' -> 'other.txt'"]
    with pytest.raises(DataError, match="now gives other tokens"):  # other content needs the flag all the same
        check_data(plan_resume(ckpt, moved, 1), edited, accept_change=False)


def test_extend_schedule_recomputes_the_rate_over_the_new_total():
    model = torch.nn.Linear(4, 4)
    opt, old = build_optimizer(model, "adamw", lr=1.0, total_steps=20, warmup_steps=0)
    for _ in range(10):
        opt.step()
        old.step()
    saved = old.state_dict()
    opt2, new = build_optimizer(model, "adamw", lr=1.0, total_steps=40, warmup_steps=0)
    extend_schedule(new, saved)
    assert new.last_epoch == 10
    assert opt2.param_groups[0]["lr"] == pytest.approx(new.lr_lambdas[0](10))  # cosine over 40, at step 10
    assert opt2.param_groups[0]["lr"] > 0.5  # not the old schedule's 0.5 at its midpoint


# ---------------------------------------------------------------- one run, one directory


@pytest.mark.slow
def test_a_second_writer_is_refused_naming_the_holder_and_a_killed_holder_frees_the_directory(tmp_path):
    """A real second process holds the lock; this one is refused with its PID. kill -9 the holder
    and the directory is free again (the OS releases the lock)."""
    import signal
    import subprocess
    import sys

    from recipes.resume import claim_run_directory

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from recipes.resume import "
         f"claim_run_directory as c; lock = c(Path({str(tmp_path)!r}), False, False); print('held', flush=True); "
         "time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip  # one command line
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=rf"in use by another trainer \(pid {holder.pid} on "):
            claim_run_directory(tmp_path, False, False)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock = claim_run_directory(tmp_path, True, False)
    assert lock is not None and f"pid {__import__('os').getpid()}" in (tmp_path / "train.lock").read_text()
    lock.close()
    assert claim_run_directory(tmp_path, True, False, is_main=False) is None  # other ranks take no lock


def test_a_fresh_start_over_a_run_is_refused_and_overwrite_moves_it_aside(tmp_path):
    from recipes.resume import claim_run_directory, move_run_aside

    (tmp_path / "checkpoints" / "step_00000004").mkdir(parents=True)
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(
        ConfigError, match=r"holds a run \(checkpoints up to step_00000004\): continue it with --resume"
    ):
        claim_run_directory(tmp_path, False, False)
    claim_run_directory(tmp_path, True, False).close()  # --resume: continue it
    lock = claim_run_directory(tmp_path, False, True)  # --overwrite: let through, moved aside once all is checked
    assert (tmp_path / "metrics.jsonl").is_file()
    move_run_aside(tmp_path)
    lock.close()
    (aside,) = tmp_path.glob("previous-*")
    assert (aside / "metrics.jsonl").is_file() and (aside / "checkpoints" / "step_00000004").is_dir()
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "checkpoints").exists()
    claim_run_directory(tmp_path, False, False).close()  # now free for a fresh start
