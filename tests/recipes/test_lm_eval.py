"""The lm-evaluation-harness model ``spherenet`` (recipes.lm_eval_model, recipes.evaluate),
checked against log-probabilities computed directly from the model; offline."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402

from recipes import evaluate  # noqa: E402
from recipes.checkpoints import checkpoint_files  # noqa: E402
from recipes.lm_eval_model import SphereNetLM  # noqa: E402
from spherenet.checkpoint import CheckpointManager  # noqa: E402
from spherenet.data import ByteTokenizer  # noqa: E402
from spherenet.models import from_preset  # noqa: E402

MAX_LEN = 32
PRINTABLE = list(range(32, 127))
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny nGPT written as a training run's checkpoint (model, config and tokenizer files),
    without training: the logit scaling s_z (eq. 3) is 0 for every byte but printable ASCII,
    so that greedy text is printable and never the end-of-text byte."""
    torch.manual_seed(0)
    model = from_preset("ngpt-tiny", max_seq_len=MAX_LEN).eval()
    s_z = model.s_z
    with torch.no_grad():
        s_z.param.zero_()
        s_z.param[PRINTABLE] = 12.0 * s_z.scale / s_z.init  # effective s_z: 12
    tokenizer = ByteTokenizer()
    run = tmp_path_factory.mktemp("run")
    CheckpointManager(run / "checkpoints").save(3, {"model": model}, files=checkpoint_files(model, tokenizer))
    return model, tokenizer, run


@pytest.fixture(scope="module")
def lm(trained):
    return SphereNetLM(path=trained[2], device="cpu", batch_size=3)


def request(kind: str, *args) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def direct_loglikelihood(model, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """log p(continuation | context) from one forward pass of the whole (left-cut) sequence."""
    whole = (context + continuation)[-(MAX_LEN + 1) :]
    with torch.no_grad():
        log_probs = F.log_softmax(model(torch.tensor([whole[:-1]]))[0].double(), dim=-1)
    n = len(continuation)
    targets = torch.tensor(whole[-n:])
    picked = log_probs[-n:].gather(-1, targets[:, None])
    return float(picked.sum()), bool((log_probs[-n:].argmax(-1) == targets).all())


def greedy_text(model, tokenizer, prompt: str, n: int) -> str:
    ids = torch.tensor([tokenizer.encode(prompt)])
    return tokenizer.decode(model.generate(ids, n, temperature=0)[0, ids.shape[1] :].tolist())


def test_registered_under_the_name_spherenet():
    assert get_model("spherenet") is SphereNetLM


def test_loglikelihood_equals_direct_computation(trained, lm):
    model, tokenizer, _ = trained
    greedy = greedy_text(model, tokenizer, "the sphere", 3)
    long_context = "unit vectors on the sphere, step by step, " * 3  # longer than MAX_LEN: cut from the left
    pairs = [
        ("the sphere", greedy),  # the model's own greedy continuation
        ("the sphere", greedy[:2] + ("x" if greedy[2] != "x" else "y")),  # greedy but for the last token
        ("the sphere", " holds"),
        ("the sphere ", "holds"),  # trailing space moves to the continuation, as lm_eval does
        ("", "vector"),  # empty context: conditioned on the end-of-text byte
        (long_context, " and on"),
        ("a", "b"),
    ]
    got = lm.loglikelihood([request("loglikelihood", c, x) for c, x in pairs])

    eot = tokenizer.eos_id
    for (context, continuation), (log_prob, is_greedy) in zip(pairs, got):
        if not context:
            context_ids, continuation_ids = [eot], tokenizer.encode(continuation)
        else:
            text = context.rstrip(" ")
            context_ids, continuation_ids = (
                tokenizer.encode(text),
                tokenizer.encode(context[len(text) :] + continuation),
            )
        want_log_prob, want_greedy = direct_loglikelihood(model, context_ids, continuation_ids)
        assert log_prob == pytest.approx(want_log_prob, abs=1e-5), (context, continuation)
        assert is_greedy == want_greedy, (context, continuation)
    assert [is_greedy for _, is_greedy in got[:3]] == [True, False, False]
    assert got[2][0] == pytest.approx(got[3][0], abs=1e-5)


def test_loglikelihood_rolling_scores_each_token_once(trained, lm):
    """A text of 2.5 windows: windows of MAX_LEN predicted tokens; the last one is shorter,
    and its input is filled up with the tokens before it."""
    model, tokenizer, _ = trained
    text = "the model moves along the sphere step by step, one unit vector at a time; every vector."
    ids = tokenizer.encode(text)
    assert 2 * MAX_LEN < len(ids) < 3 * MAX_LEN
    sequence = [tokenizer.eos_id, *ids]  # target t is sequence[t], t = 1 .. len(ids)
    want = 0.0
    for start in range(1, len(sequence), MAX_LEN):
        end = min(start + MAX_LEN, len(sequence))  # targets start .. end - 1
        first_input = max(0, end - 1 - MAX_LEN)
        with torch.no_grad():
            log_probs = F.log_softmax(model(torch.tensor([sequence[first_input : end - 1]]))[0].double(), dim=-1)
        targets = torch.tensor(sequence[start:end])
        want += float(log_probs[-len(targets) :].gather(-1, targets[:, None]).sum())

    got = lm.loglikelihood_rolling([request("loglikelihood_rolling", text), request("loglikelihood_rolling", "ab")])
    assert got[0] == pytest.approx(want, abs=1e-4)
    assert got[1] == pytest.approx(direct_loglikelihood(model, [tokenizer.eos_id], tokenizer.encode("ab"))[0], abs=1e-5)


def test_generate_until_stops_at_the_stop_string_and_matches_generate(trained, lm):
    model, tokenizer, _ = trained
    prompts = ["the sphere", "unit", "on the", "sphere"]  # the last two: one batch when their settings agree
    free = [greedy_text(model, tokenizer, p, 12) for p in prompts]
    assert all(len(t) == 12 and t.isprintable() for t in free), free
    stops = [t[5] for t in free]  # a character the greedy text reaches
    requests = [
        request("generate_until", p, {"until": [stop, "never appears"], "max_gen_toks": 12, "do_sample": False})
        for p, stop in zip(prompts, stops)
    ]
    requests += [request("generate_until", p, {"until": ["never appears"], "max_gen_toks": 7}) for p in prompts]
    got = lm.generate_until(requests)
    assert got[:4] == [t.split(stop)[0] for t, stop in zip(free, stops)]
    assert got[4:] == [t[:7] for t in free]  # no stop string reached: max_gen_toks tokens

    calls = []
    hook = lm.model.register_forward_hook(lambda module, args, output: calls.append(args[0].shape))
    try:
        lm.generate_until(requests[:1])
        n_alone = len(calls)
        lm.generate_until(requests[-2:])
    finally:
        hook.remove()
    first_stop = free[0].index(stops[0])
    assert n_alone == 1 + first_stop  # the prompt, then one token at a time until the stop string
    assert calls[n_alone:] == [torch.Size([2, 6])] + [torch.Size([2, 1])] * 6  # two prompts decoded together


def test_local_multiple_choice_task_matches_direct_accuracy(trained, lm, tmp_path, monkeypatch):
    """simple_evaluate on a task read from a local JSON Lines file: every choice's score and
    the accuracy equal those computed directly from the model."""
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # the environment report (torch.utils.collect_env, several subprocesses) takes seconds, and is not under test
    monkeypatch.setattr("lm_eval.evaluator.add_env_info", lambda results: None)
    model, tokenizer, _ = trained
    docs = [
        {"question": "The sphere holds", "choices": ["vectors", "cats", "rain"]},
        {"question": "Each row has unit", "choices": ["length", "price"]},
        {"question": "The model moves", "choices": ["along it", "away", "never", "fast"]},
        {"question": "Step by", "choices": ["step", "stone"]},
    ]
    scores = [
        [
            direct_loglikelihood(model, tokenizer.encode(d["question"]), tokenizer.encode(" " + c))[0]
            for c in d["choices"]
        ]
        for d in docs
    ]
    best = [max(range(len(s)), key=s.__getitem__) for s in scores]
    for i, doc in enumerate(docs):  # the model's pick is right for the first two docs only: accuracy 0.5
        doc["answer"] = best[i] if i < 2 else (best[i] + 1) % len(doc["choices"])
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "local_choice.yaml").write_text(
        f"""task: spherenet_local_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
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
    manager = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
    results = lm_eval.simple_evaluate(
        model=lm, tasks=["spherenet_local_choice"], task_manager=manager, bootstrap_iters=0, log_samples=True
    )
    assert results["results"]["spherenet_local_choice"]["acc,none"] == pytest.approx(0.5)
    for sample in results["samples"]["spherenet_local_choice"]:
        got = [log_prob for log_prob, _ in sample["filtered_resps"]]
        assert got == pytest.approx(scores[sample["doc_id"]], abs=1e-5)


def test_exported_directory_scores_like_the_run(trained, lm, tmp_path):
    pytest.importorskip("safetensors")
    from recipes.checkpoints import load_trained
    from recipes.export import export

    export(load_trained(trained[2]), tmp_path / "exported")
    exported = SphereNetLM(path=tmp_path / "exported", device="cpu")
    pairs = [request("loglikelihood", "the sphere", " holds"), request("loglikelihood", "", "unit")]
    got, want = exported.loglikelihood(pairs), lm.loglikelihood(pairs)
    assert [g for _, g in got] == [g for _, g in want]
    assert [p for p, _ in got] == pytest.approx([p for p, _ in want], abs=1e-5)


def test_bad_paths_and_arguments_are_named(trained, tmp_path):
    with pytest.raises(FileNotFoundError, match="no run directory or exported model at"):
        SphereNetLM(path=tmp_path / "missing", device="cpu")
    with pytest.raises(ValueError, match="is neither a training run .* nor a model written by recipes.export"):
        SphereNetLM(path=tmp_path, device="cpu")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="holds config.json but no model.safetensors"):
        SphereNetLM(path=tmp_path, device="cpu")
    with pytest.raises(ValueError, match="needs path="):
        SphereNetLM(device="cpu")
    run = trained[2]
    with pytest.raises(ValueError, match="batch_size 'auto' is not supported"):
        SphereNetLM(path=run, device="cpu", batch_size="auto")
    with pytest.raises(ValueError, match="max_length 64 exceeds the model's max_seq_len 32"):
        SphereNetLM(path=run, device="cpu", max_length=64)
    with pytest.raises(ValueError, match="dtype must be 'auto' or one of"):
        SphereNetLM(path=run, device="cpu", dtype="fp8")


def test_missing_lm_eval_names_the_extra(monkeypatch):
    for name in [name for name in sys.modules if name == "lm_eval" or name.startswith("lm_eval.")]:
        monkeypatch.setitem(sys.modules, name, None)  # "not installed" to the import system
    path = Path(evaluate.__file__).with_name("lm_eval_model.py")
    spec = importlib.util.spec_from_file_location("lm_eval_model_without_lm_eval", path)
    with pytest.raises(ImportError, match=r'pip install "spherenet-torch\[eval\]"'):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_command_line_registers_the_model_then_runs_lm_eval(monkeypatch, trained, hub_flags):
    import lm_eval.__main__

    seen = {}

    def recording_cli():
        seen["argv"] = sys.argv[1:]
        seen["model"] = get_model("spherenet")

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", recording_cli)
    monkeypatch.setattr(sys, "argv", ["spherenet-eval"])
    monkeypatch.setattr(hub_flags[0], "ENDPOINT", f"http://127.0.0.1:{closed_local_port()}")  # no real Hub probe
    args = ["--model", "spherenet", "--model_args", f"path={trained[2]}", "--tasks", "hellaswag"]
    assert evaluate.main(args) == 0
    assert seen == {"argv": args, "model": SphereNetLM}


@pytest.fixture
def hub_flags(monkeypatch):
    """The offline flags and Hub address that ``evaluate`` reads or sets, put back after the test
    (they are process-wide: a flag left on would change the tests that follow)."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    return huggingface_hub.constants, datasets.config, monkeypatch


def closed_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the with-block ends: connections are refused


def test_an_unreachable_hub_turns_offline_mode_on_before_lm_eval_starts(hub_flags):
    hub, datasets_config, monkeypatch = hub_flags
    monkeypatch.setattr(hub, "ENDPOINT", f"http://127.0.0.1:{closed_local_port()}")
    reason = evaluate.offline_unless_the_hub_answers(timeout=2.0)
    assert reason is not None and "127.0.0.1" in reason
    assert hub.HF_HUB_OFFLINE and hub.is_offline_mode()
    assert datasets_config.HF_HUB_OFFLINE and datasets_config.HF_DATASETS_OFFLINE
    assert os.environ["HF_HUB_OFFLINE"] == os.environ["HF_DATASETS_OFFLINE"] == "1"
    line = evaluate.hub_unreachable(ConnectionError("Couldn't reach 'Rowan/hellaswag'"), reason)
    assert reason in line and "Rowan/hellaswag" in line and "went offline" in line and "--include_path DIR" in line


def test_a_hub_that_answers_or_offline_mode_already_on_changes_nothing(hub_flags):
    hub, datasets_config, monkeypatch = hub_flags
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        monkeypatch.setattr(hub, "ENDPOINT", f"http://127.0.0.1:{listening.getsockname()[1]}")
        assert evaluate.offline_unless_the_hub_answers(timeout=2.0) is None
    assert not hub.HF_HUB_OFFLINE and not datasets_config.HF_HUB_OFFLINE and "HF_HUB_OFFLINE" not in os.environ

    monkeypatch.setattr(hub, "ENDPOINT", f"http://127.0.0.1:{closed_local_port()}")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # the user's own offline mode: no probe, nothing to add
    assert evaluate.offline_unless_the_hub_answers(timeout=2.0) is None
    assert not hub.HF_HUB_OFFLINE and "HF_HUB_OFFLINE" not in os.environ
