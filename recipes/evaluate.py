"""lm-evaluation-harness on a trained model: ``spherenet-eval`` or ``python -m recipes.evaluate``.

    spherenet-eval --model spherenet --model_args path=runs/x \\
        --tasks arc_easy,hellaswag,winogrande,lambada_openai --device cpu
    spherenet-eval --model spherenet --model_args path=exported/ngpt,dtype=bfloat16 --batch_size 16 \\
        --tasks hellaswag --num_fewshot 0 --output_path results/

Takes ``lm_eval``'s arguments: it registers the ``spherenet`` model (:mod:`recipes.lm_eval_model`)
and then runs ``lm_eval``'s own command line, which does not discover models of other packages
by itself. ``--help`` starts with how to name the spherenet model, then lm_eval's options. A
``path=`` that holds no model is one ``error:`` line (exit 2) before lm_eval starts. Datasets
are fetched by ``lm_eval`` from the Hugging Face Hub (or read from its cache); a task whose
dataset cannot be reached is one ``error:`` line saying so (exit 2): a task of your own with a
local copy of its data (a YAML in a folder given to ``--include_path``) runs offline. When one
short connection to the Hub fails before ``lm_eval`` starts, the run goes on in offline mode (the
local cache and local tasks still serve), so that a task needing the Hub fails at once instead of
after ``huggingface_hub``'s retries. Needs
``pip install "spherenet-torch[eval]"``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from recipes.cli import prog

HELP = """usage: {prog} --model spherenet --model_args path=PATH[,KEY=VALUE...] --tasks TASK[,TASK...] [lm_eval options]

Evaluate a spherenet model (nGPT or GPT) with lm-evaluation-harness.

  --model spherenet        the model this command registers
  --model_args path=PATH   PATH: a training run's directory, its checkpoints/ directory, one step_*
                           checkpoint, or a directory written by spherenet-export
                           other keys: dtype=auto|float32|bfloat16|float16, batch_size=N,
                           max_length=N, max_gen_toks=N, seed=N (comma-separated after path=)
  --device cpu|cuda        where to run (default: lm_eval's)

  e.g. {prog} --model spherenet --model_args path=runs/default --tasks lambada_openai --device cpu

lm_eval's own options follow.
"""


def _option(argv: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``argv`` (the last one given)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def check_model_path(argv: list[str]) -> str | None:
    """What is wrong with the spherenet model's ``path=`` in ``argv``, or None. Checked before
    lm_eval starts, so that a typo costs one line, not a traceback after the tasks load."""
    if _option(argv, "--model") != "spherenet":
        return None
    model_args = _option(argv, "--model_args") or ""
    pairs = dict(part.split("=", 1) for part in model_args.split(",") if "=" in part)
    path = pairs.get("path")
    if not path:
        return "--model spherenet needs --model_args path=PATH (a run directory or an exported model)"
    if not Path(path).expanduser().exists():
        return f"--model_args path={path}: no run directory, checkpoint or exported model there"
    return None


def offline_unless_the_hub_answers(timeout: float = 3.0) -> str | None:
    """Offline mode for the rest of this process when the Hub (or its proxy) does not take one TCP
    connection within ``timeout`` seconds; returns why, or None when the Hub answered or offline mode
    was already on. ``huggingface_hub`` and ``datasets`` read their offline flags at each request,
    so setting them here holds for what ``lm_eval`` loads later; the environment variables carry it
    to anything imported after."""
    from spherenet.data import hub_offline, hub_unreachable

    if hub_offline():
        return None
    reason = hub_unreachable(timeout)
    if reason is None:
        return None
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    import datasets.config
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    return reason


def hub_unreachable(exc: BaseException, probe: str | None = None) -> str:
    """One line for a task whose dataset is on the Hugging Face Hub when the Hub cannot be reached;
    ``probe`` is why the connection tried before ``lm_eval`` started failed (then offline mode was
    this command's doing, not the user's)."""
    local = (
        "evaluate a local copy of the data: a task YAML with dataset_path: json and data_files, in a folder passed "
        "as --include_path DIR"
    )
    if probe:
        return (
            f"this task's dataset needs the Hugging Face Hub, which cannot be reached ({probe}; so this run went "
            f"offline: {' '.join(str(exc).split())}); connect, or {local}"
        )
    return (
        f"this task's dataset needs the Hugging Face Hub, which cannot be reached ({' '.join(str(exc).split())}); "
        f"connect (and unset HF_DATASETS_OFFLINE / HF_HUB_OFFLINE), or {local}"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    name = prog("recipes.evaluate")
    try:  # registers the "spherenet" model; without lm_eval, an error naming the extra to install
        import recipes.lm_eval_model  # noqa: F401
    except ImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from lm_eval.__main__ import cli_evaluate

    if not argv or "-h" in argv or "--help" in argv:
        print(HELP.format(prog=name), flush=True)
        argv = ["--help"]
    else:
        problem = check_model_path(argv)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    sys.argv = [name, *argv]  # lm_eval's command line reads sys.argv itself
    probe = None if argv == ["--help"] else offline_unless_the_hub_answers()
    try:
        cli_evaluate()
    except SystemExit as exc:  # --help, or lm_eval's own usage errors (argparse: exit 2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except ConnectionError as exc:  # a task's dataset on the Hub, offline or unreachable
        print(f"error: {hub_unreachable(exc, probe)}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as exc:  # the model's arguments (path=, dtype=, batch_size=)
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
