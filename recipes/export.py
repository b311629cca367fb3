"""Export a trained checkpoint in the Hugging Face layout: ``python -m recipes.export RUN OUT``.

    python -m recipes.export runs/default exported/ngpt-cpu
    python -m recipes.export runs/default exported/step400 --step 400
    python -m recipes.export runs/default exported/ngpt-cpu --overwrite   # replace an earlier export

RUN is a run's ``train.out_dir``, its ``checkpoints/`` directory, or one ``step_*`` checkpoint;
the newest sound checkpoint is used unless ``--step`` picks one. OUT receives ``config.json``
and ``model.safetensors`` (``NGPT.from_pretrained(OUT)`` / ``GPT.from_pretrained(OUT)`` or
``spherenet.models.load_pretrained(OUT)`` load them; with ``auto_map`` and the portable code,
``configuration_spherenet.py``, ``guards_spherenet.py`` and ``modeling_spherenet.py``, so does transformers' ``AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True)``), the tokenizer's files
(``spherenet.data.tokenizer.load_tokenizer(OUT)``, and a ``tokenizer.json`` for every tokenizer,
which ``tokenizers`` / ``transformers`` load, with ``tokenizer_config.json`` naming its end-of-text
token as ``eos_token``: for the byte tokenizer ``<0xFF>``, id 255, or ``<|endoftext|>``, id 256,
of its 257-token variant), a model card, ``README.md``, and
``sha256sums.json``, the size and sha256 of every other file, checked when the model is loaded.
OUT must not hold a training run nor lie inside one (any run's directory, its ``checkpoints/``,
a checkpoint), nor be held by a live trainer. It must be empty or absent; ``--overwrite``
replaces an earlier export there (as one rename: a failed export leaves the old one in place) and
nothing else: a directory that contains the source, or that holds a file the earlier export's
manifest does not list, or one whose contents changed since (an edited model card), is refused
(:func:`check_destination`). Needs ``pip install "spherenet-torch[hub]"``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import uuid
from pathlib import Path

from recipes.checkpoints import TOKENIZER_DIR, Trained, is_exported, load_trained
from recipes.cli import prog
from recipes.run_directory import LOCK_FILE, METRICS_FILE, live_trainer, run_in_directory
from spherenet.checkpoint import (
    RUN_CHECKPOINTS,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointManager,
    describe_os_error,
    holds_checkpoints,
    verify_files_manifest,
)
from spherenet.data import DataError, process_alive
from spherenet.data.tokenizer import TOKENIZER_JSON
from spherenet.io import (  # noqa: F401 - TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP: recipes.export's names
    MANIFEST_NAME,
    SPECIAL_TOKENS_MAP,
    TOKENIZER_CONFIG,
    write_manifest,
    write_transformers_tokenizer_config,
)
from spherenet.models import PretrainedFileError

CARD = "README.md"


def step_checkpoint(run: str | Path, step: int) -> Path:
    """The ``step_*`` directory of checkpoint ``step`` under a run (or its checkpoints/) directory."""
    run = Path(run)
    for directory in (run / RUN_CHECKPOINTS, run):
        manager = CheckpointManager(directory)
        found = dict(manager.checkpoints())
        if step in found:
            return found[step]
        if found:
            raise CheckpointError(f"no checkpoint of step {step} in {directory}; steps there: {sorted(found)}")
    raise CheckpointError(f"no checkpoint found at {run} (expected a run dir or its checkpoints/ dir)")


def model_card(trained: Trained) -> str:
    """The exported directory's ``README.md``: what the model is, how it was trained, how to load it."""
    model, cfg = trained.model, trained.model.config
    kind = type(model).__name__
    n_params = sum(p.numel() for p in model.parameters())
    run = trained.config
    data, optim, train = run.get("data", {}), run.get("optim", {}), run.get("train", {})
    what = (
        "nGPT, the normalized Transformer (Loshchilov et al., 2024, arXiv 2410.01131): every weight "
        "matrix and the hidden state are unit vectors on the hypersphere"
        if kind == "NGPT"
        else "the baseline GPT (pre-norm Transformer with RMSNorm, RoPE and SwiGLU) that nGPT is compared against"
    )
    tokens = (
        int(train.get("steps", 0)) * int(train.get("batch_size", 0)) * int(train.get("block_size") or cfg.max_seq_len)
    )
    rows = [
        ("parameters", f"{n_params / 1e6:.2f}M"),
        ("layers x d_model x heads", f"{cfg.n_layers} x {cfg.d_model} x {cfg.n_heads}"),
        ("vocabulary", f"{cfg.vocab_size} ({trained.tokenizer.name} tokenizer)"),
        ("context", f"{cfg.max_seq_len} tokens"),
        ("trained", f"{trained.step} steps" + (f", {tokens:,} tokens" if tokens else "")),
        ("data", str(data.get("source", "unknown"))),
        ("optimizer", f"{optim.get('method', 'unknown')}, lr {optim.get('lr', 'unknown')}"),
        ("checkpoint", str(trained.path)),
    ]
    table = "\n".join(f"| {key} | {value} |" for key, value in rows)
    return f"""---
library_name: spherenet
tags:
- {kind.lower()}
- spherenet
---

# {kind}, {n_params / 1e6:.2f}M parameters

{what}. Trained with spherenet's `recipes.train` and exported with `recipes.export`.

| | |
|---|---|
{table}

## Use

```python
import torch
from spherenet.models import load_pretrained
from spherenet.data.tokenizer import load_tokenizer

model = load_pretrained("path/to/this/directory")  # dtype=, device= as in Hugging Face
tokenizer = load_tokenizer("path/to/this/directory")
ids = torch.tensor([tokenizer.encode("Hello")])
print(tokenizer.decode(model.generate(ids, 50)[0].tolist()))
```

With transformers (`pip install "spherenet-torch[hf]"`; `trust_remote_code=True` runs this directory's
`configuration_spherenet.py`, `guards_spherenet.py` and `modeling_spherenet.py`, which need torch and transformers only):

```python
from transformers import AutoModelForCausalLM, pipeline

model = AutoModelForCausalLM.from_pretrained("path/to/this/directory", trust_remote_code=True)
generator = pipeline("text-generation", model="path/to/this/directory", trust_remote_code=True)
print(generator("Hello", max_new_tokens=50)[0]["generated_text"])
```

`tokenizer.json` loads with `tokenizers.Tokenizer.from_file` (token ids are the same).
Evaluate with `spherenet-eval --model spherenet --model_args path=<this directory> --tasks ...`;
fine-tune with `spherenet-train train.init_from=<this directory>`.

The full training configuration:

```json
{json.dumps(run, indent=1, sort_keys=True)}
```
"""


RUN_FILES = (METRICS_FILE, LOCK_FILE)  # beside its checkpoints, what shows a training run's directory
TMP_PREFIX, OLD_PREFIX = ".tmp-export-", ".old-export-"


def holds_run(directory: Path) -> str | None:
    """What shows that ``directory`` is (part of) a training run: its checkpoints
    (:func:`spherenet.checkpoint.holds_checkpoints`) or a run's own files; None otherwise."""
    found = holds_checkpoints(directory)
    return found or next((name for name in RUN_FILES if (directory / name).exists()), None)


def run_above(directory: Path) -> str | None:
    """What shows that ``directory``, a folder above a destination, is a training run or part of
    one (its lock, its records, checkpoints), as :func:`holds_run` but for a bare
    ``checkpoints/`` folder, which other tools keep too, often at a project's root."""
    found = run_in_directory(directory) or holds_checkpoints(directory)
    if found == RUN_CHECKPOINTS:  # holds_checkpoints' name for a bare checkpoints/ folder
        found = None
    return found or (LOCK_FILE if (directory / LOCK_FILE).exists() else None)


def check_destination(out: str | Path, source: str | Path, overwrite: bool) -> None:
    """The rule of every command that writes a directory: never inside a run, and it replaces only
    what it wrote. Refused, in one line, are a destination inside a training run or held by a
    live trainer (:func:`refuse_run_directory`). Without ``overwrite`` OUT must be empty or absent
    (:func:`refuse_non_empty`). With it, OUT (when it holds anything) must be an earlier export,
    all of whose files its manifest lists with their contents as exported
    (:func:`refuse_all_but_an_earlier_export`), and must not contain the source being exported."""
    out, source = Path(out), Path(source)
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out} exists and is not a directory; export into a new directory")
    if overwrite:
        real_out, real_source = out.resolve(), source.resolve()
        if real_out == real_source or real_out in real_source.parents:
            raise CheckpointError(
                f"--overwrite would replace {out}, which contains the source {source}; export into a directory "
                "outside it"
            )
    refuse_run_directory(out, overwrite)
    if not overwrite:
        refuse_non_empty(out)
    elif out.exists() and any(out.iterdir()):
        refuse_all_but_an_earlier_export(out)


def refuse_run_directory(out: Path, overwrite: bool) -> None:
    """CheckpointError when ``out`` is held by a live trainer, holds a training run, or lies
    inside one (any run, not only the source's), whether or not it exists yet: an export there
    would be read as part of the run (a new ``step_*`` as a damaged checkpoint by every later
    resume, export and sample)."""
    refused = "--overwrite refused: " if overwrite else ""
    real_out = out.resolve()
    for directory in (real_out, *real_out.parents):
        holder = live_trainer(directory)
        if holder is not None:
            raise CheckpointError(f"{refused}{out} is in use by a live trainer ({holder}); export elsewhere")
    found = holds_run(real_out)
    if found is not None:
        why = "export replaces only an earlier export: " if overwrite else ""
        raise CheckpointError(f"{refused}{out} holds a training run ({found}); {why}export elsewhere")
    for directory in real_out.parents:
        found = run_above(directory)
        if found is not None:
            raise CheckpointError(
                f"{refused}{out} is inside a training run ({directory}: {found}); an export there would be read as "
                "part of it: export elsewhere"
            )


def refuse_all_but_an_earlier_export(out: Path) -> None:
    """CheckpointError unless the non-empty ``out`` is an earlier export as it was written: each
    file listed by its manifest, with the size and sha256 recorded there. A file that no export
    wrote, or one changed since (a model card or config.json edited by hand), is the user's."""
    listed = _manifest_files(out)
    if listed is None:
        raise CheckpointError(
            f"--overwrite refused: {out} is not an earlier export (no {MANIFEST_NAME}); export replaces only an "
            "earlier export: export elsewhere, or empty it yourself"
        )
    foreign = sorted(
        str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and str(p.relative_to(out)) not in listed
    )
    if foreign:
        raise CheckpointError(
            f"--overwrite refused: {out} holds {foreign[0]}"
            + (f" and {len(foreign) - 1} more file(s)" if len(foreign) > 1 else "")
            + f", which no export wrote ({MANIFEST_NAME} does not list it); move it, or export elsewhere"
        )
    edited = _edited_files(out, listed)
    if edited:
        more = f" (and {len(edited) - 1} more: {', '.join(edited[1:])})" if len(edited) > 1 else ""
        raise CheckpointError(
            f"--overwrite refused: {out / edited[0]}{more} was changed after it was exported ({MANIFEST_NAME} "
            f"records other contents), so it is yours: to keep it, move it out of {out}; to discard it, delete it; "
            "then export again"
        )


def _manifest_files(directory: Path) -> set[str] | None:
    """The files an export's manifest lists, with the manifest itself; None without one."""
    try:
        files = json.loads((directory / MANIFEST_NAME).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {*files, MANIFEST_NAME} if isinstance(files, dict) else None


def _edited_files(directory: Path, listed: set[str]) -> list[str]:
    """The files of the export in ``directory`` whose size or sha256 differ from its manifest's.
    One deleted since is not among them: nothing of it is left to lose."""
    edited = []
    for name in sorted(listed - {MANIFEST_NAME}):
        if not (directory / name).is_file():
            continue
        try:
            verify_files_manifest(directory, [name], MANIFEST_NAME)
        except CheckpointCorruptError:
            edited.append(name)
    return edited


def _owner_tag() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def remove_stale_leftovers(out: Path) -> None:
    """Remove the ``.tmp-export-*`` / ``.old-export-*`` directories beside ``out`` that an export
    killed half-way left (written by a process of this host that is gone); those of live
    processes or other hosts are left alone."""
    host = socket.gethostname()
    for prefix in (TMP_PREFIX, OLD_PREFIX):
        for d in out.parent.glob(f"{prefix}{out.name}-*"):
            owner = d.name[len(prefix) + len(out.name) + 1 :].rsplit("-", 2)  # host, pid, random
            if len(owner) != 3 or owner[0] != host or not owner[1].isdigit() or not d.is_dir():
                continue
            if not process_alive(int(owner[1])):
                shutil.rmtree(d, ignore_errors=True)


def refuse_non_empty(out: str | Path) -> None:
    """CheckpointError when the directory ``out`` exists and is not empty (export never mixes its
    files with others, nor replaces an earlier export unasked). The message offers ``--overwrite``
    only where it would be taken: over an earlier export."""
    out = Path(out)
    if out.is_dir() and any(out.iterdir()):
        if _manifest_files(out) is not None:
            raise CheckpointError(
                f"{out} is not empty; pass --overwrite to replace the earlier export there, or export elsewhere"
            )
        raise CheckpointError(f"{out} is not empty and holds no earlier export ({MANIFEST_NAME}); export elsewhere")


def export(trained: Trained, out: str | Path, overwrite: bool = False) -> list[Path]:
    """Write ``trained``'s model (``save_pretrained``), tokenizer files, model card and a
    manifest of them all into ``out``; returns the paths written. ``out`` must be empty or
    absent (:func:`refuse_non_empty`) unless ``overwrite``: then its contents are replaced.
    Everything is written into a temporary directory beside ``out`` first and moved in only when
    complete: a failed export (disk full, read-only) leaves no half-written files in ``out``."""
    out = Path(out)
    check_destination(out, trained.path, overwrite)
    train = trained.config.get("train", {})
    if train.get("lora_rank") and not train.get("lora_sphere_aware", True) and type(trained.model).__name__ == "NGPT":
        raise CheckpointError(
            f"{trained.path} was fine-tuned with a plain LoRA of nGPT (train.lora_sphere_aware=false): its merged "
            "matrices are off the sphere, and an nGPT export holds unit rows only; fine-tune with the sphere-aware "
            "LoRA (train.lora_sphere_aware=true) to export"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_leftovers(out)
    tmp = out.parent / f"{TMP_PREFIX}{out.name}-{_owner_tag()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        trained.model.save_pretrained(tmp)
        stored = trained.path / TOKENIZER_DIR
        if trained.tokenizer_files:  # the checkpoint's own, hash-verified tokenizer files
            for name, content in trained.tokenizer_files.items():
                (tmp / name).write_bytes(content)
        elif stored.is_dir():
            for f in sorted(stored.iterdir()):
                if f.is_file():
                    shutil.copy2(f, tmp / f.name)
        else:  # written before checkpoints held their tokenizer: save the one rebuilt from its spec
            trained.tokenizer.save(tmp)
        if not (tmp / TOKENIZER_JSON).is_file():  # the byte tokenizer: its tokenizer.json form
            (tmp / TOKENIZER_JSON).write_text(trained.tokenizer.tokenizer_json(), encoding="utf-8")
        write_transformers_tokenizer_config(tmp, trained.tokenizer.eos_id, trained.model.config.max_seq_len)
        (tmp / CARD).write_text(model_card(trained), encoding="utf-8")
        write_manifest(tmp, sorted(p.name for p in tmp.iterdir() if p.name != MANIFEST_NAME))
        names = sorted(p.name for p in tmp.iterdir())
        old = out.parent / f"{OLD_PREFIX}{out.name}-{_owner_tag()}-{uuid.uuid4().hex[:8]}"
        if out.exists():
            os.replace(out, old)  # a directory cannot be renamed over a non-empty one: move it aside
        try:
            os.replace(tmp, out)
        except OSError:
            if old.exists():
                os.replace(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    first = ["config.json", "model.safetensors"]
    return [out / name for name in first + [n for n in names if n not in first]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog("recipes.export"), description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="run directory, checkpoints/ directory or step_* checkpoint")
    p.add_argument("out", help="directory to write config.json, model.safetensors and the tokenizer into")
    p.add_argument(
        "--step", type=int, default=None, help="export this step's checkpoint (default: the newest sound one)"
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace an earlier export in OUT (by default OUT must be empty)"
    )
    args = p.parse_args(argv)
    action = "cannot read"
    try:
        if not Path(args.run).exists():
            raise CheckpointError(f"no run directory or checkpoint at {args.run}")
        check_destination(args.out, args.run, args.overwrite)  # before the (long) read
        if is_exported(args.run):
            raise CheckpointError(
                f"{args.run} is an exported model already (config.json + model.safetensors): it is what export "
                "writes; copy the directory, or export from the run it came from"
            )
        source = step_checkpoint(args.run, args.step) if args.step is not None else args.run
        trained = load_trained(source)
        action = "cannot write"
        written = export(trained, args.out, overwrite=args.overwrite)
    except (CheckpointError, DataError, PretrainedFileError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the source unreadable, or the destination read-only, full, not permitted; errno named
        print(f"error: {describe_os_error(exc, action)}", file=sys.stderr)
        return 2
    print(f"exported {type(trained.model).__name__} from {trained.path} (step {trained.step}):")
    for path in written:
        print(f"  {path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
