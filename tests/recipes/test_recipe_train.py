"""End-to-end tests of recipes/train.py on CPU: the main job, local files, resume, bad input,
and DDP / FSDP2 with two gloo processes launched by torchrun."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from corpora import write_paragraphs

from recipes.train import cli
from spherenet.checkpoint import CheckpointWarning

REPO = Path(__file__).resolve().parents[2]
SHAKESPEARE = REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"

# A tiny, fast run: 2-layer nGPT, context 32, batch 8.
TINY = [
    "model.preset=ngpt-tiny",
    "model.max_seq_len=32",
    "train.batch_size=8",
    "train.log_every=1",
    "train.eval_every=5",
    "train.eval_batches=2",
    "train.checkpoint_every=5",
    "train.sample_tokens=0",
    "train.progress=false",
]


def read_log(out_dir: Path) -> list[dict]:
    with (out_dir / "metrics.jsonl").open() as f:
        return [json.loads(line) for line in f]


def losses(out_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_log(out_dir) if "loss" in r}


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    """A small local corpus of real-looking text: paragraphs become documents."""
    return write_paragraphs(
        tmp_path_factory.mktemp("corpus") / "corpus.txt",
        "the sphere holds every vector of unit length and the model moves along it step by step",
        400,
        seed=0,
    )


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data_cache")


def run(out_dir: Path, cache: Path, *extra: str) -> int:
    return cli([*TINY, f"train.out_dir={out_dir}", f"data.cache_dir={cache}", *extra])


def test_main_job_on_default_corpus(tmp_path, cache, capsys):
    rc = cli(
        [
            "model.preset=ngpt-tiny",
            "model.max_seq_len=32",
            "train.batch_size=4",
            "train.steps=4",
            "train.eval_every=2",
            "train.eval_batches=2",
            "train.sample_tokens=16",
            f"train.out_dir={tmp_path / 'run'}",
            f"data.cache_dir={cache}",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    log = read_log(tmp_path / "run")
    steps = [r for r in log if "loss" in r]
    assert [r["step"] for r in steps if r["step"] % 2 == 0] == [2, 4]
    assert all(math.isfinite(r["loss"]) for r in steps)
    assert any("val_loss" in r for r in steps)
    assert log[-1]["event"] == "done" and log[-1]["sphere_norm_error"] < 1e-5
    assert (tmp_path / "run" / "checkpoints" / "step_00000004" / "MANIFEST.json").is_file()
    assert (
        "--- sample: prompt ---\n" in out
        and "\n--- sample: the model's continuation ---\n" in out
        and "ngpt-tiny" in out
    )


def test_gpt_on_local_text_file(tmp_path, cache, text_file, capsys):
    rc = run(
        tmp_path / "gpt",
        cache,
        "model.preset=gpt-tiny",
        "optim.method=adamw",
        "optim.warmup_steps=2",
        "train.steps=6",
        f"data.source={text_file}",
    )
    assert rc == 0
    got = losses(tmp_path / "gpt")
    assert sorted(got) == [1, 2, 3, 4, 5, 6] and all(math.isfinite(v) for v in got.values())
    done = capsys.readouterr().out.strip().splitlines()[-1]
    assert done.startswith("done: step 6, val loss ") and ", no sphere weights, checkpoints in " in done, done


@pytest.mark.slow
@pytest.mark.skipif(not SHAKESPEARE.is_file(), reason="../shared/data/tinyshakespeare absent")
def test_loss_falls_on_tinyshakespeare(tmp_path, cache):
    rc = run(
        tmp_path / "tsh",
        cache,
        f"data.source={SHAKESPEARE}",
        "model.max_seq_len=64",
        "train.batch_size=16",
        "train.steps=80",
        "train.eval_every=80",
        "train.eval_batches=4",
        "optim.lr=5e-3",
    )
    assert rc == 0
    got = losses(tmp_path / "tsh")
    first = sum(got[s] for s in range(1, 6)) / 5
    last = sum(got[s] for s in range(76, 81)) / 5
    final_val = [r["val_loss"] for r in read_log(tmp_path / "tsh") if "val_loss" in r][-1]
    assert first > 5.0  # ~ln(256): a uniform guess over bytes
    assert last < first - 1.5, (first, last)
    assert final_val < 3.8, final_val


def test_resume_continues_exactly(tmp_path, cache, text_file):
    common = ["train.steps=20", f"data.source={text_file}", "train.checkpoint_every=10"]
    assert run(tmp_path / "straight", cache, *common) == 0
    assert run(tmp_path / "split", cache, *common, "train.halt_after=10") == 0
    assert sorted(losses(tmp_path / "split")) == list(range(1, 11))
    assert cli([*TINY, f"train.out_dir={tmp_path / 'split'}", f"data.cache_dir={cache}", *common, "--resume"]) == 0
    straight, split = losses(tmp_path / "straight"), losses(tmp_path / "split")
    assert sorted(split) == list(range(1, 21))
    for step in range(1, 21):
        assert split[step] == pytest.approx(straight[step], abs=1e-7), step


def test_a_run_halted_before_its_first_validation_reports_no_val_loss(tmp_path, cache, text_file, capsys):
    assert run(tmp_path / "early", cache, f"data.source={text_file}", "train.steps=20", "train.halt_after=3") == 0
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    assert last.startswith("halted before train.steps (continue with --resume): step 3, no validation yet, ")
    assert "nan" not in out and "val loss" not in out
    halted = read_log(tmp_path / "early")[-1]
    assert halted["event"] == "halted" and "val_loss" not in halted


def test_a_resumed_run_reports_the_last_validation_its_log_has(tmp_path, cache, text_file, capsys):
    common = [f"data.source={text_file}", "train.steps=10", "train.eval_every=5", "train.checkpoint_every=5"]
    assert run(tmp_path / "r", cache, *common, "train.halt_after=7") == 0
    logged = [r["val_loss"] for r in read_log(tmp_path / "r") if "val_loss" in r and "event" not in r]
    capsys.readouterr()
    # continued from step 7 and halted at 9: no validation in this invocation, the log's (step 5) stands
    assert cli([*TINY, f"train.out_dir={tmp_path / 'r'}", f"data.cache_dir={cache}", *common, "train.halt_after=9", "--resume"]) == 0  # fmt: skip  # a command line
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert len(logged) == 1
    assert last.startswith(f"halted before train.steps (continue with --resume): step 9, val loss {logged[0]:.4f}, ")


def test_the_progress_bar_shows_a_val_loss_once_there_is_one():
    from recipes.trainer import report_step

    class Bar:
        def set_postfix(self, **postfix):
            self.postfix = postfix

        def update(self, n):
            pass

    bar, record = Bar(), dict(step=3, loss=2.5, lr=1e-3, tok_per_s=100.0)
    report_step(bar, record, None, None, is_main=True)
    assert list(bar.postfix) == ["loss", "lr", "tok_s"]
    report_step(bar, record, 2.25, None, is_main=True)
    assert bar.postfix["val"] == "2.2500"


def flat_scalings(config: dict) -> dict:
    """An nGPT config dict in the flat spelling of earlier versions (``alpha_init``, ...)."""
    out = {key: value for key, value in config.items() if not isinstance(value, dict)}
    for prefix, name in (("alpha", "alpha_attn"), ("s_qk", "s_qk"), ("s_uv", "s_u"), ("s_z", "s_z")):
        out.update({f"{prefix}_{field}": config[name][field] for field in ("init", "scale", "mode")})
    out["alpha_abs"] = config["alpha_attn"]["absolute"]
    return out


def rewrite_as_flat(step_dir: Path) -> dict:
    """Rewrite a checkpoint's model.json and state.pt's model_config to the flat spelling, and
    its manifest's hashes to match, as an earlier version wrote them. Returns the old config."""
    import hashlib

    desc = json.loads((step_dir / "model.json").read_text())
    desc["config"] = flat_scalings(desc["config"])
    (step_dir / "model.json").write_text(json.dumps(desc))
    state = torch.load(step_dir / "state.pt", weights_only=True)
    state["values"]["model_config"] = flat_scalings(state["values"]["model_config"])
    torch.save(state, step_dir / "state.pt")
    manifest = json.loads((step_dir / "MANIFEST.json").read_text())
    for name in ("model.json", "state.pt"):
        data = (step_dir / name).read_bytes()
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (step_dir / "MANIFEST.json").write_text(json.dumps(manifest))
    return desc["config"]


def test_run_written_with_flat_scaling_keys_is_refused_by_name(tmp_path, cache, text_file, capsys):
    """A run directory whose checkpoint holds the flat model config of earlier versions no longer
    loads: loading names the file and the fields, and --resume stops with exit 2."""
    from recipes.checkpoints import load_trained
    from spherenet.checkpoint import CheckpointError

    out, common = tmp_path / "run", [f"data.source={text_file}", "train.checkpoint_every=2"]
    assert run(out, cache, *common, "train.steps=2") == 0
    old = rewrite_as_flat(out / "checkpoints" / "step_00000002")
    assert "alpha_init" in old and "alpha_attn" not in old

    with pytest.raises(
        CheckpointError, match="step_00000002: .* has field\\(s\\) 'alpha_abs', 'alpha_init'.*NGPTConfig does not know"
    ):
        load_trained(out)
    capsys.readouterr()
    assert run(out, cache, *common, "train.steps=4", "--resume") == 2
    assert "alpha_init" in capsys.readouterr().err
    assert sorted(losses(out)) == [1, 2]


# --- bad input: a clear message, exit code 2, nothing half-written ------------------------


def test_missing_data_file(tmp_path, cache, capsys):
    assert run(tmp_path / "r", cache, "train.steps=2", f"data.source={tmp_path / 'nope.txt'}") == 2
    err = capsys.readouterr().err
    assert "nope.txt" in err and "Traceback" not in err
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_a_file_whose_extension_does_not_say_its_format_trains_once_data_format_names_it(
    tmp_path, cache, text_file, capsys
):
    corpus = tmp_path / "corpus"  # no extension
    corpus.write_bytes(text_file.read_bytes())
    assert run(tmp_path / "r", cache, "train.steps=2", f"data.source={corpus}") == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "data.format=text" in err and str(corpus) in err
    assert not (tmp_path / "r" / "checkpoints").exists()
    assert run(tmp_path / "r", cache, "train.steps=2", f"data.source={corpus}", "data.format=text") == 0
    assert sorted(losses(tmp_path / "r")) == [1, 2]
    # a format the file is not in is refused by what it finds, not trained on
    assert run(tmp_path / "j", cache, "train.steps=2", f"data.source={corpus}", "data.format=json") == 2
    assert "json" in capsys.readouterr().err


def test_empty_data_file(tmp_path, cache, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert run(tmp_path / "r", cache, "train.steps=2", f"data.source={empty}") == 2
    err = capsys.readouterr().err
    assert "empty.txt" in err and "empty" in err.lower()


@pytest.mark.parametrize(
    "override, needle",
    [
        ("train.stepz=3", "train.stepz"),
        ("optim.lr=-1", "optim.lr"),
        ("model.n_heads=3", "n_heads"),
        ("model.nonsense=1", "nonsense"),
        ("model.preset=ngpt-2b", "ngpt-2b"),
        ("train.batch_size=7", "micro_batch_size"),
    ],
)
def test_bad_config_values_are_named(tmp_path, cache, capsys, override, needle):
    extra = ["train.micro_batch_size=2"] if override == "train.batch_size=7" else []
    assert run(tmp_path / "r", cache, "train.steps=2", *extra, override) == 2
    err = capsys.readouterr().err
    assert needle in err and err.startswith("error:"), err


def test_checkpoint_from_another_model(tmp_path, cache, text_file, capsys):
    out = tmp_path / "r"
    assert run(out, cache, "train.steps=2", f"data.source={text_file}") == 0
    before = sorted(p.name for p in (out / "checkpoints").iterdir())
    rc = run(out, cache, "train.steps=4", f"data.source={text_file}", "model.n_layers=3", "--resume")
    err = capsys.readouterr().err
    assert rc == 2
    assert "model.n_layers: 2 in the checkpoint, 3 now" in err, err  # refused before building anything
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == before  # untouched


# --- distributed: two gloo processes through torchrun --------------------------------------


def torchrun(nproc: int, args: list[str], timeout: int = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "recipes.train",
        *args,
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_match_one(tmp_path, cache, text_file, parallel):
    common = [*TINY, "train.steps=8", f"data.source={text_file}", f"data.cache_dir={cache}"]
    assert cli([*common, f"train.out_dir={tmp_path / 'one'}"]) == 0  # prepares the data cache too
    torchrun(2, [*common, f"train.out_dir={tmp_path / 'two'}", f"train.parallel={parallel}"])
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(two) == list(range(1, 9))
    for step in range(1, 9):
        assert two[step] == pytest.approx(one[step], abs=1e-5), (step, one[step], two[step])
    log = read_log(tmp_path / "two")
    assert log[0]["event"] == "start" and log[0]["world_size"] == 2
    assert log[-1]["event"] == "done" and log[-1]["sphere_norm_error"] < 1e-5


@pytest.mark.slow
def test_compiled_run_matches_eager(tmp_path, cache, text_file):
    """--compile trains the same model: the per-step losses match eager within float tolerance,
    and the optimizer's retraction still runs (sphere rows unit at the end)."""
    common = ["train.steps=3", f"data.source={text_file}"]
    assert run(tmp_path / "eager", cache, *common) == 0
    assert cli([*TINY, f"train.out_dir={tmp_path / 'compiled'}", f"data.cache_dir={cache}", *common, "--compile"]) == 0
    eager, compiled = losses(tmp_path / "eager"), losses(tmp_path / "compiled")
    assert sorted(compiled) == [1, 2, 3]
    for step in (1, 2, 3):
        assert compiled[step] == pytest.approx(eager[step], abs=1e-4), step
    assert read_log(tmp_path / "compiled")[-1]["sphere_norm_error"] < 1e-5


# --- resuming with other settings: accepted where sound, refused before any work ----------


def checkpoint_bytes(out_dir: Path) -> dict[str, bytes]:
    root = out_dir / "checkpoints"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_resume_with_another_micro_batch_continues_the_run(tmp_path, cache, text_file, capsys):
    """The data position counts global batches: a resumed run may accumulate gradients over
    another number of micro-batches and still sees the data of the uninterrupted run."""
    common = ["train.steps=12", f"data.source={text_file}", "train.checkpoint_every=6"]
    assert run(tmp_path / "straight", cache, *common) == 0
    assert run(tmp_path / "split", cache, *common, "train.micro_batch_size=4", "train.halt_after=6") == 0
    saved = torch.load(tmp_path / "split" / "checkpoints" / "step_00000006" / "state.pt", weights_only=True)
    assert saved["stateful"]["train_windows"]["step"] == 6  # 6 global batches, not 12 micro-batches
    capsys.readouterr()
    assert run(tmp_path / "split", cache, *common, "train.micro_batch_size=2", "--resume") == 0
    assert "resume: train.micro_batch_size 4 -> 2: gradient accumulation changes" in capsys.readouterr().out
    straight, split = losses(tmp_path / "straight"), losses(tmp_path / "split")
    assert sorted(split) == list(range(1, 13))
    for step in range(1, 13):  # accumulation reorders the sums: equal to rounding
        assert split[step] == pytest.approx(straight[step], abs=1e-5), step


@pytest.mark.slow
def test_resume_with_more_steps_recomputes_the_schedule(tmp_path, cache, text_file, capsys):
    """A finished run extended with a larger train.steps follows the warmup + cosine schedule of
    the new total from the checkpoint's step on (the LR jumps up from the old schedule's end)."""
    common = [f"data.source={text_file}", "optim.warmup_steps=2"]
    assert run(tmp_path / "long", cache, *common, "train.steps=16") == 0
    out = tmp_path / "run"
    assert run(out, cache, *common, "train.steps=10") == 0
    old_lr = {r["step"]: r["lr"] for r in read_log(out) if "lr" in r}
    capsys.readouterr()
    assert run(out, cache, *common, "train.steps=16", "--resume") == 0
    printed = capsys.readouterr().out
    assert "resume: train.steps 10 -> 16: the learning-rate schedule (warmup + cosine to 0) is recomputed" in printed
    log = read_log(out)
    assert any(r.get("event") == "resume_changes" and "train.steps 10 -> 16" in r["changes"][0] for r in log)
    lr = {r["step"]: r["lr"] for r in log if "lr" in r}
    long_lr = {r["step"]: r["lr"] for r in read_log(tmp_path / "long") if "lr" in r}
    assert sorted(lr) == list(range(1, 17))
    for step in range(11, 17):
        assert lr[step] == pytest.approx(long_lr[step], rel=1e-12), step
    assert lr[11] > old_lr[10]
    assert all(math.isfinite(v) for v in losses(out).values())

    # Fewer steps than the checkpoint has done: refused, nothing touched.
    before = checkpoint_bytes(out)
    assert run(out, cache, *common, "train.steps=12", "--resume") == 2
    err = capsys.readouterr().err
    assert "train.steps 12 is below the step of checkpoint" in err and "(16)" in err, err
    assert checkpoint_bytes(out) == before


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, cache, text_file) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    assert run(out, cache, "train.steps=2", f"data.source={text_file}") == 0
    return out


@pytest.mark.parametrize(
    "override, needle",
    [
        ("train.batch_size=16", "train.batch_size: 8 in the checkpoint, 16 now"),
        ("train.seed=1", "train.seed: 1337 in the checkpoint, 1 now"),
        ("model.n_heads=2", "model.n_heads: 4 in the checkpoint, 2 now"),
    ],
)
def test_refused_resume_does_no_work_and_leaves_checkpoints(
    finished_run, tmp_path, cache, text_file, capsys, monkeypatch, override, needle
):
    import recipes.train

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    before = checkpoint_bytes(out)

    def no_data(*args, **kwargs):
        raise AssertionError("the data was prepared before the resume was refused")

    monkeypatch.setattr(recipes.train, "prepare_data", no_data)
    assert run(out, cache, "train.steps=4", f"data.source={text_file}", override, "--resume") == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and needle in err and "Traceback" not in err, err
    assert checkpoint_bytes(out) == before


def test_unsharded_checkpoint_is_refused_under_fsdp(finished_run, cache, text_file):
    """DCP reshards an FSDP checkpoint into any layout; a single-process / DDP checkpoint (one
    torch.save file) is not loaded into FSDP-sharded parameters: refused from the manifest."""
    from recipes.resume import plan_resume
    from recipes.train import build_config, parse_args
    from spherenet.checkpoint import CheckpointManager
    from spherenet.train.config import ConfigError

    found = CheckpointManager(finished_run / "checkpoints").latest_verified()
    args = [
        *TINY,
        f"train.out_dir={finished_run}",
        f"data.cache_dir={cache}",
        f"data.source={text_file}",
        "train.steps=4",
    ]
    fsdp = build_config(parse_args([*args, "train.parallel=fsdp"]))
    with pytest.raises(ConfigError, match=r"train.parallel: checkpoint .* was written unsharded .* train.parallel=ddp"):
        plan_resume(found, fsdp, world_size=2)
    assert plan_resume(found, fsdp, world_size=1).steps_changed  # one process: fsdp means unsharded, accepted
    ddp = build_config(parse_args([*args, "train.parallel=ddp"]))
    assert "train.parallel none x 1 process(es) -> ddp x 2 process(es)" in plan_resume(found, ddp, world_size=2).notes


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp_run_resumed_as_ddp_then_single_process(tmp_path, cache, text_file):
    """FSDP2 x 2 (steps 1-4, a DCP checkpoint) -> DDP x 2 (5-8, DCP resharded into whole
    tensors) -> one process (9-12, a torch.save checkpoint of 2 ranks): the losses are those of
    one uninterrupted single-process run."""
    common = [
        *TINY,
        "train.steps=12",
        "train.checkpoint_every=4",
        f"data.source={text_file}",
        f"data.cache_dir={cache}",
    ]
    assert cli([*common, f"train.out_dir={tmp_path / 'one'}"]) == 0
    out = tmp_path / "moved"
    torchrun(2, [*common, f"train.out_dir={out}", "train.parallel=fsdp", "train.halt_after=4"])
    from recipes.checkpoints import load_trained

    sharded = load_trained(out)  # a DCP checkpoint read into one unsharded model, as sample does
    assert type(sharded.model).__name__ == "NGPT" and sharded.step == 4
    proc = torchrun(2, [*common, f"train.out_dir={out}", "train.parallel=ddp", "train.halt_after=8", "--resume"])
    assert "resume: train.parallel fsdp x 2 process(es) -> ddp x 2 process(es)" in proc.stdout
    with pytest.warns(CheckpointWarning, match="written by 2 rank\\(s\\), now 1"):  # fewer ranks than wrote it: said
        assert cli([*common, f"train.out_dir={out}", "--resume"]) == 0
    one, moved = losses(tmp_path / "one"), losses(out)
    assert sorted(moved) == list(range(1, 13))
    for step in range(1, 13):
        assert moved[step] == pytest.approx(one[step], abs=1e-5), (step, one[step], moved[step])


def test_a_fresh_start_over_a_run_is_refused_and_overwrite_moves_it_aside(tmp_path, cache, text_file, capsys):
    out, common = tmp_path / "run", [f"data.source={text_file}", "train.steps=2"]
    assert run(out, cache, *common) == 0
    capsys.readouterr()
    assert run(out, cache, *common) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: train.out_dir {out} holds a run (checkpoints up to step_00000002)")
    assert "--resume" in err and "--overwrite" in err
    assert run(out, cache, *common, "--overwrite") == 0
    (aside,) = out.glob("previous-*")
    assert (aside / "checkpoints" / "step_00000002").is_dir() and (out / "checkpoints" / "step_00000002").is_dir()


def test_overrides_stand_anywhere_on_the_line():
    from recipes.train import parse_args

    parsed = parse_args(["train.steps=5", "--resume", "train.log_every=1", "--overwrite", "optim.lr=0.01"])
    assert parsed.resume and parsed.overwrite
    assert parsed.overrides == ["train.steps=5", "train.log_every=1", "optim.lr=0.01"]


def test_accept_data_change_without_resume_is_refused(tmp_path, capsys):
    assert cli(["--accept-data-change", f"train.out_dir={tmp_path / 'run'}"]) == 2
    assert "--accept-data-change applies to --resume only" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before anything is written
