"""lm-evaluation-harness's own command line (``lm_eval --model hf``) on an export written by
recipes.export: it loads through transformers (``trust_remote_code``) and scores a local task
as ``spherenet-eval`` does; ``spherenet-eval`` on a task whose dataset is on the Hub, offline,
says so in one line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

from recipes.checkpoints import Trained  # noqa: E402
from recipes.export import export  # noqa: E402
from spherenet.data import ByteTokenizer  # noqa: E402
from spherenet.models import NGPT, NGPTConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

DOCS = [
    {"question": "The capital of France is", "choices": [" Paris", " Rome", " Berlin"], "answer": 0},
    {"question": "The capital of Italy is", "choices": [" Paris", " Rome", " Berlin"], "answer": 1},
    {"question": "Two plus two is", "choices": [" four", " five"], "answer": 0},
    {"question": "Snow is", "choices": [" white", " green", " loud", " warm"], "answer": 0},
]
TEXTS = [{"text": "A stitch in time saves nine."}, {"text": "All that glitters is not gold, " * 3}]


def offline_env() -> dict[str, str]:
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """An export of a tiny nGPT whose scalings are moved off their initial values (so that a
    wrong position or mask changes its scores), and a folder of two local tasks: multiple choice
    and a perplexity over whole texts (windows shorter than the texts)."""
    base = tmp_path_factory.mktemp("hf_cli")
    torch.manual_seed(0)
    model = NGPT(NGPTConfig(vocab_size=256, n_layers=2, d_model=32, n_heads=4, max_seq_len=48)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.mul_(1 + 3 * torch.rand_like(p))
    export(Trained(model, ByteTokenizer(), {}, 0, base / "step_0"), base / "export")
    tasks = base / "tasks"
    tasks.mkdir()
    for name, docs, body in (
        (
            "local_choice",
            DOCS,
            'output_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
            "doc_to_target: answer\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n",
        ),
        (
            "local_text",
            TEXTS,
            'output_type: loglikelihood_rolling\ndoc_to_text: "{{text}}"\ndoc_to_target: "{{text}}"\nmetric_list:\n'
            "  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n",
        ),
    ):
        (tasks / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
        (tasks / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tasks / name}.jsonl\n"
            f"  cache_dir: {base / 'hf_cache'}\ntest_split: test\n{body}"
        )
    return base


def run_cli(command: list[str], out: Path) -> dict:
    """Run an lm_eval-like command line on both local tasks; its results and per-document scores."""
    args = ["--tasks", "local_choice,local_text", "--device", "cpu", "--batch_size", "2"]
    args += ["--output_path", str(out), "--log_samples"]
    done = subprocess.run(command + args, cwd=ROOT, env=offline_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (results_file,) = out.rglob("results_*.json")
    samples = {}
    for task in ("local_choice", "local_text"):
        (samples_file,) = out.rglob(f"samples_{task}_*.jsonl")
        rows = [json.loads(line) for line in samples_file.read_text().splitlines()]
        samples[task] = {row["doc_id"]: row["filtered_resps"] for row in rows}
    return {"results": json.loads(results_file.read_text())["results"], "samples": samples}


def test_lm_eval_hf_command_scores_an_export_as_spherenet_eval_does(setup):
    include = ["--include_path", str(setup / "tasks")]
    hf = run_cli(
        ["lm_eval", "--model", "hf", "--model_args", f"pretrained={setup / 'export'},trust_remote_code=True", *include],
        setup / "out_hf",
    )
    own = run_cli(
        [sys.executable, "-m", "recipes.evaluate", "--model", "spherenet", "--model_args", f"path={setup / 'export'}"]
        + include,
        setup / "out_spherenet",
    )
    for task, metrics in (
        ("local_choice", ("acc,none", "acc_norm,none")),
        ("local_text", ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none")),
    ):
        for metric in metrics:
            assert hf["results"][task][metric] == pytest.approx(own["results"][task][metric], rel=1e-5), (task, metric)
    assert own["results"]["local_text"]["bits_per_byte,none"] > 1.0  # a real score, not a degenerate one
    # every choice's log-likelihood, and every text's, is the same number
    for task in ("local_choice", "local_text"):
        assert (
            set(hf["samples"][task])
            == set(own["samples"][task])
            == set(range(len(DOCS if "choice" in task else TEXTS)))
        )
        for doc, responses in own["samples"][task].items():
            got = [float(r[0]) if isinstance(r, list) else float(r) for r in hf["samples"][task][doc]]
            want = [float(r[0]) if isinstance(r, list) else float(r) for r in responses]
            assert got == pytest.approx(want, abs=1e-4), (task, doc)


def test_spherenet_eval_names_a_task_that_needs_the_hub_in_one_line(setup):
    done = subprocess.run(
        [sys.executable, "-m", "recipes.evaluate", "--model", "spherenet", "--model_args", f"path={setup / 'export'}"]
        + ["--tasks", "hellaswag", "--device", "cpu", "--limit", "1"],
        cwd=ROOT,
        env=offline_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert "needs the Hugging Face Hub, which cannot be reached" in errors[0]
    assert "hellaswag" in errors[0] and "--include_path DIR" in errors[0]


def test_spherenet_eval_goes_offline_at_once_when_the_hub_does_not_answer(setup):
    """Without offline mode set, an unreachable Hub is found by one connection before lm_eval
    starts: a Hub task then fails in one line, without huggingface_hub's retries (about 25 s)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    env = {k: v for k, v in offline_env().items() if k not in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{closed}"
    done = subprocess.run(
        [sys.executable, "-m", "recipes.evaluate", "--model", "spherenet", "--model_args", f"path={setup / 'export'}"]
        + ["--tasks", "hellaswag", "--device", "cpu", "--limit", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "Retrying" not in done.stderr, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert f"127.0.0.1:{closed}" in errors[0] and "went offline" in errors[0] and "hellaswag" in errors[0]
