"""The recipes on a directory in the published Normalized-Nemotron layout: a tiny synthetic
checkpoint written here in that layout (tests/models/nemotron_checkpoints.py's writer) with a small
tokenizer.json, fine-tuned by recipes.train (the directory's model and tokenizer), sampled,
analyzed and evaluated by spherenet-eval; offline."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import random
import re
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("safetensors")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
nemotron_checkpoints = importlib.import_module("nemotron_checkpoints")  # the layout's synthetic-checkpoint writer

from recipes import analyze, sample, train  # noqa: E402
from recipes.checkpoints import load_trained, load_weights  # noqa: E402
from spherenet.analysis import sphere_norm_error  # noqa: E402
from spherenet.data import build_tokenizer  # noqa: E402
from spherenet.models import NGPT, load_pretrained, nemotron_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "the a sphere row unit vector model moves along each step turns by small angle keeps its norm one".split()
VOCAB = 64  # the model's and the tokenizer's: the words, "</s>", "<unk>" and unused tokens


def corpus_text(paragraphs: int = 120, seed: int = 0) -> str:
    """Paragraphs of a few sentences drawn from a small grammar: easy to learn in a few steps."""
    rng = random.Random(seed)
    sentences = [
        "the model moves along the sphere",
        "each row keeps its norm one",
        "a step turns the vector by a small angle",
        "the unit vector moves along each row",
    ]
    return "\n\n".join(" ".join(rng.choice(sentences) for _ in range(4)) for _ in range(paragraphs)) + "\n"


def write_tokenizer(directory: Path) -> Path:
    """A word-level tokenizer.json of ``VOCAB`` tokens built with the ``tokenizers`` library:
    "</s>" (end of text), "<unk>", the words, then unused tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokens = ["</s>", "<unk>", *WORDS]
    tokens += [f"unused{i}" for i in range(VOCAB - len(tokens))]
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["</s>"])
    path = directory / "tokenizer.json"
    tokenizer.save(str(path))
    return path


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    """A directory in the published layout: config.json, two safetensors shards with their
    index, and tokenizer.json."""
    config = {**nemotron_checkpoints.CONFIG, "vocab_size": VOCAB}
    directory = tmp_path_factory.mktemp("nemotron") / "model"
    nemotron_checkpoints.write_checkpoint(
        directory, config, nemotron_checkpoints.random_layout_tensors(config, seed=3), shards=2
    )
    write_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "sphere.txt"
    path.write_text(corpus_text(), encoding="utf-8")
    return path


def train_args(published: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"train.init_from={published}",
        f"data.source={corpus}",
        f"data.cache_dir={out.parent / 'cache'}",
        "data.val_fraction=0.1",
        f"train.out_dir={out}",
        "train.steps=8",
        "train.batch_size=4",
        "train.block_size=32",
        "train.eval_every=4",
        "train.eval_batches=2",
        "train.log_every=1",
        "train.checkpoint_every=8",
        "train.sample_tokens=0",
        "optim.lr=1e-2",
        "--device",
        "cpu",
        "--no-progress",
        *extra,
    ]


@pytest.fixture(scope="module")
def fine_tuned(published, corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finetune") / "run"
    assert train.cli(train_args(published, corpus, out)) == 0
    return out


def test_fine_tuning_takes_the_directorys_model_and_tokenizer(published, fine_tuned):
    records = [json.loads(line) for line in (fine_tuned / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 8 and all(math.isfinite(v) for v in losses)
    assert sum(losses[-2:]) < sum(losses[:2]) - 0.5  # it learns: the loss falls over a few steps
    run = load_trained(fine_tuned)
    model, tokenizer = run.model, run.tokenizer
    assert isinstance(model, NGPT)
    values = json.loads((published / "config.json").read_text())
    assert dataclasses.asdict(model.config) == dataclasses.asdict(nemotron_config(values))
    assert (model.config.n_kv_heads, model.config.head_dim, model.config.mlp) == (2, 12, "relu2")
    theirs = build_tokenizer(f"hf:{published / 'tokenizer.json'}")
    assert tokenizer.fingerprint == theirs.fingerprint and run.config["data"]["tokenizer"].endswith("tokenizer.json")
    # trained: the weights moved away from the directory's, and the sphere rows are still unit
    start = load_weights(published).model
    assert not torch.equal(model.embed_in.weight, start.embed_in.weight)
    assert sphere_norm_error(model, torch.device("cpu")) < 1e-5
    with torch.no_grad():
        worst = max(float((w.norm(dim=-1) - 1).abs().max()) for w in model.sphere_weights().values())
    assert worst < 1e-5


def test_the_fine_tuned_run_exports_like_any_ngpt(fine_tuned, tmp_path):
    from recipes.export import main as export_main

    assert export_main([str(fine_tuned), str(tmp_path / "exported")]) == 0
    saved = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert saved["model_type"] == "spherenet-ngpt" and saved["n_kv_heads"] == 2 and saved["mlp"] == "relu2"
    exported = load_pretrained(tmp_path / "exported")
    trained = load_trained(fine_tuned).model
    ids = torch.tensor([[2, 3, 4, 5, 6]])
    torch.testing.assert_close(exported(ids), trained(ids), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["model.n_layers=3"], r"model.n_layers=3 \(the directory's: 2\)"),
        (["model.alpha_attn.init=0.5"], r"model.alpha_attn.init=0.5 \(the directory's: 0.3\)"),
        (["model.preset=gpt-tiny"], r"model.preset=gpt-tiny builds another model"),
        (["data.tokenizer=byte"], r"data.tokenizer=byte is not the tokenizer of train.init_from=.*tokenizer.json"),
    ],
)
def test_what_contradicts_the_directory_is_refused_by_name(published, corpus, tmp_path, capsys, extra, named):
    assert train.cli(train_args(published, corpus, tmp_path / "run", *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(named, err), err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_agreeing_overrides_and_the_same_tokenizer_start_from_the_directorys_weights(
    published, corpus, tmp_path, capsys
):
    args = train_args(published, corpus, tmp_path / "run", "model.n_layers=2", f"data.tokenizer=hf:{published}")
    assert train.main([*args, "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "n_kv_heads = 2" in printed and 'mlp = "relu2"' in printed and "head_dim = 12" in printed
    assert train.cli([*args, "train.steps=1", "optim.lr=1e-12"]) == 0  # a step too small to move the weights
    start, run = load_weights(published).model.state_dict(), load_trained(tmp_path / "run").model.state_dict()
    assert start.keys() == run.keys()
    for name in start:
        torch.testing.assert_close(run[name], start[name], rtol=0, atol=1e-6, msg=name)


def test_a_directory_without_tokenizer_json_is_one_line(published, corpus, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for file in published.iterdir():
        if file.name != "tokenizer.json":
            (bare / file.name).write_bytes(file.read_bytes())
    assert train.cli(train_args(bare, corpus, tmp_path / "run")) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"error: train.init_from={bare} has no tokenizer.json: copy the model's tokenizer there"
    )
    assert sample.main([str(bare), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {bare} holds a Normalized-Nemotron model but no tokenizer.json: copy its tokenizer there"


def test_sample_continues_a_prompt_from_the_directory(published, capsys):
    assert (
        sample.main(
            [str(published), "--prompt", "the sphere", "--tokens", "6", "--temperature", "0", "--device", "cpu"]
        )
        == 0
    )
    out = capsys.readouterr()
    assert "(exported NGPT)" in out.err
    text = out.out.strip()
    assert text.startswith("the sphere") and len(text.split()) > 2  # the prompt and new words
    model = load_weights(published).model
    tokenizer = build_tokenizer(f"hf:{published / 'tokenizer.json'}")
    prompt = torch.tensor([tokenizer.encode("the sphere")])
    greedy = model.generate(prompt, 6, temperature=0)[0].tolist()
    eos = tokenizer.eos_id
    want = greedy[: greedy.index(eos, 2)] if eos in greedy[2:] else greedy
    assert text == tokenizer.decode(want)


def test_analyze_writes_its_figures_and_statistics(published, tmp_path):
    assert analyze.main([str(published), "--out", str(tmp_path / "a"), "--device", "cpu", "--no-progress"]) == 0
    for name in ("fig4_embeddings.png", "fig5_condition.png", "fig6_scalings.png", "stats.json", "summary.md"):
        assert (tmp_path / "a" / name).stat().st_size > 0, name
    stats = next(iter(json.loads((tmp_path / "a" / "stats.json").read_text()).values()))
    assert stats["model"] == "NGPT" and stats["model_config"]["n_kv_heads"] == 2
    assert stats["embeddings"]["input"]["norm_mean"] == pytest.approx(1.0, abs=1e-6)  # stored unit rows
    assert len(stats["condition_numbers"]["attn_q"]) == 2


def test_spherenet_eval_scores_the_directory(published, tmp_path, monkeypatch):
    lm_eval = pytest.importorskip("lm_eval")
    from recipes import evaluate
    from recipes.lm_eval_model import SphereNetLM

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("lm_eval.evaluator.add_env_info", lambda results: None)  # seconds, not under test
    docs = [
        {"question": "the model moves", "choices": ["along", "norm", "angle"]},
        {"question": "each row keeps its", "choices": ["norm", "step"]},
        {"question": "a step turns the", "choices": ["vector", "sphere", "one"]},
        {"question": "the unit", "choices": ["vector", "row"]},
    ]
    lm = SphereNetLM(path=published, device="cpu")
    scores = [
        [lp for lp, _ in lm.loglikelihood([_request(d["question"], " " + c) for c in d["choices"]])] for d in docs
    ]
    best = [max(range(len(s)), key=s.__getitem__) for s in scores]
    for i, doc in enumerate(docs):  # the model's pick is right for the first two docs only: accuracy 0.5
        doc["answer"] = best[i] if i < 2 else (best[i] + 1) % len(doc["choices"])
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "sphere_choice.yaml").write_text(
        f"""task: spherenet_nemotron_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tmp_path / "docs.jsonl"}
  cache_dir: {tmp_path / "hf_cache"}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""
    )
    args = ["--model", "spherenet", "--model_args", f"path={published}", "--tasks", "spherenet_nemotron_choice"]
    args += ["--include_path", str(tmp_path / "tasks"), "--device", "cpu", "--output_path", str(tmp_path / "out")]
    assert evaluate.main(args) == 0
    results = json.loads(next((tmp_path / "out").rglob("results*.json")).read_text())
    assert results["results"]["spherenet_nemotron_choice"]["acc,none"] == pytest.approx(0.5)
    assert lm_eval is not None


def _request(context: str, continuation: str):
    from lm_eval.api.instance import Instance

    return Instance(request_type="loglikelihood", doc={}, arguments=(context, continuation), idx=0)


def test_init_from_streams_the_directory_into_the_runs_model(published, monkeypatch):
    """The run's model is filled tensor by tensor from the files: no whole second model is
    loaded (the general loader is never called), and the weights are the directory's."""
    from recipes import init_from
    from spherenet.models import from_normalized_nemotron, nemotron_config_of
    from spherenet.train.config import load_config

    def whole_model_loader(*args, **kwargs):
        raise AssertionError("init_from loaded a whole second model")

    monkeypatch.setattr(init_from, "load_weights", whole_model_loader)
    model = NGPT(nemotron_config_of(published))
    section = load_config(None, [f"train.init_from={published}"]).train
    init_from.read_starting_weights(section, resuming=False).load_into(model, is_main=False)
    expected = from_normalized_nemotron(published, dtype=torch.float32).state_dict()
    got = model.state_dict()
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


@pytest.fixture(scope="module")
def written_with_byte_tokenizer(tmp_path_factory) -> Path:
    """A directory that spherenet wrote in the layout (to_normalized_nemotron) with its byte
    tokenizer: tokenizer.json, whose end-of-text token <0xFF> is no special token, and
    tokenizer_config.json naming it."""
    from spherenet.data.tokenizer import ByteTokenizer
    from spherenet.io import to_normalized_nemotron

    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("written") / "model"
    to_normalized_nemotron(nemotron_checkpoints.layout_ngpt(vocab_size=256), directory, tokenizer=ByteTokenizer())
    return directory


def test_the_recipes_take_spherenets_byte_tokenizer_in_a_layout_directory(
    written_with_byte_tokenizer, corpus, tmp_path, capsys
):
    directory = written_with_byte_tokenizer
    args = [str(directory), "--prompt", "the sphere", "--tokens", "4", "--temperature", "0", "--device", "cpu"]
    assert sample.main(args) == 0
    assert capsys.readouterr().out.startswith("the sphere")
    out = tmp_path / "run"
    extra = ["train.steps=2", "train.eval_every=2", "train.checkpoint_every=2"]
    assert train.cli(train_args(directory, corpus, out, *extra)) == 0
    run = load_trained(out)
    assert (run.tokenizer.eos_id, run.tokenizer.vocab_size) == (255, 256)
    assert run.tokenizer.encode("héllo") == list("héllo".encode())
