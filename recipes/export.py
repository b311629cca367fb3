"""Export a trained checkpoint in the Hugging Face layout: ``python -m recipes.export RUN OUT``.

    python -m recipes.export runs/default exported/ngpt-cpu
    python -m recipes.export runs/default exported/step400 --step 400

RUN is a run's ``train.out_dir``, its ``checkpoints/`` directory, or one ``step_*`` checkpoint;
the newest sound checkpoint is used unless ``--step`` picks one. OUT receives ``config.json``
and ``model.safetensors`` (``NGPT.from_pretrained(OUT)`` / ``GPT.from_pretrained(OUT)`` or
``spherenet.models.load_pretrained(OUT)`` load them) and the tokenizer's files
(``spherenet.data.tokenizer.load_tokenizer(OUT)``). Needs ``pip install "spherenet[hub]"``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from recipes.checkpoints import TOKENIZER_DIR, Trained, load_trained
from spherenet.checkpoint import CheckpointError, CheckpointManager
from spherenet.data import DataError
from spherenet.models import PretrainedFileError


def step_checkpoint(run: str | Path, step: int) -> Path:
    """The ``step_*`` directory of checkpoint ``step`` under a run (or its checkpoints/) directory."""
    run = Path(run)
    for directory in (run / "checkpoints", run):
        manager = CheckpointManager(directory)
        found = dict(manager.checkpoints())
        if step in found:
            return found[step]
        if found:
            raise CheckpointError(f"no checkpoint of step {step} in {directory}; steps there: {sorted(found)}")
    raise CheckpointError(f"no checkpoint found at {run} (expected a run dir or its checkpoints/ dir)")


def export(trained: Trained, out: str | Path) -> list[Path]:
    """Write ``trained``'s model (``save_pretrained``) and tokenizer files into ``out``;
    returns the paths written."""
    out = Path(out)
    trained.model.save_pretrained(out)
    stored = trained.path / TOKENIZER_DIR
    if stored.is_dir():  # the checkpoint's own, hash-verified tokenizer files
        tokenizer_files = [Path(shutil.copy2(f, out / f.name)) for f in sorted(stored.iterdir()) if f.is_file()]
    else:  # written before checkpoints held their tokenizer: save the one rebuilt from its spec
        trained.tokenizer.save(out)
        tokenizer_files = [out / name for name in sorted(trained.tokenizer.to_files())]
    return [out / "config.json", out / "model.safetensors", *tokenizer_files]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m recipes.export", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="run directory, checkpoints/ directory or step_* checkpoint")
    p.add_argument("out", help="directory to write config.json, model.safetensors and the tokenizer into")
    p.add_argument(
        "--step", type=int, default=None, help="export this step's checkpoint (default: the newest sound one)"
    )
    args = p.parse_args(argv)
    try:
        if not Path(args.run).exists():
            raise CheckpointError(f"no run directory or checkpoint at {args.run}")
        source = step_checkpoint(args.run, args.step) if args.step is not None else args.run
        trained = load_trained(source)
        written = export(trained, args.out)
    except (CheckpointError, DataError, PretrainedFileError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"exported {type(trained.model).__name__} from {trained.path} (step {trained.step}):")
    for path in written:
        print(f"  {path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
