"""A trained NGPT / GPT as an lm-evaluation-harness model, registered under the name ``spherenet``.

    spherenet-eval --model spherenet --model_args path=runs/x --tasks arc_easy,hellaswag,winogrande,lambada_openai
    python -m recipes.evaluate --model spherenet --model_args path=exported/ngpt --batch_size 16 --tasks lambada_openai

``lm_eval``'s own command cannot see models registered by other packages (it knows only its own
list), so ``spherenet-eval`` (``recipes.evaluate``) imports this module, which registers the
model, and then runs ``lm_eval``'s command line with the same arguments. From Python::

    import lm_eval
    from recipes.lm_eval_model import SphereNetLM

    results = lm_eval.simple_evaluate(model=SphereNetLM(path="runs/x"), tasks=["hellaswag"])

``path`` is a training run (its directory, its ``checkpoints/`` directory or one ``step_*``
checkpoint: the newest sound checkpoint is used, as in ``recipes.sample``) or a directory
written by ``recipes.export`` (``config.json``, ``model.safetensors`` and the tokenizer's files).
The adapter lives in ``recipes`` because it reads run directories (``recipes.checkpoints``);
the library ``spherenet`` does not depend on lm_eval. Needs ``pip install "spherenet-torch[eval]"``.

Scoring follows the harness's conventions: the end-of-text id of the run's tokenizer is the
context of an empty context and of a document's first token; a context longer than the model's
window is cut from the left; a document longer than the window is scored in disjoint windows
that each see as much preceding text as fits (``loglikelihood_rolling``).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from recipes.checkpoints import load_weights
from spherenet import install_hint
from spherenet.checkpoint import CheckpointError
from spherenet.data import DataError, Tokenizer
from spherenet.io import CONFIG_NAME, WEIGHTS_NAME
from spherenet.layers import KVCache
from spherenet.models import sample_next_token

INSTALL_HINT = install_hint("eval")

try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.models.utils import normalize_gen_kwargs
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError as exc:
    raise ImportError(
        f"the lm-evaluation-harness adapter needs the package 'lm_eval' (>= 0.4); install it with: {INSTALL_HINT} "
        f"({exc})"
    ) from None

__all__ = ["INSTALL_HINT", "SphereNetLM", "load_model_and_tokenizer"]

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model_and_tokenizer(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, Tokenizer]:
    """The model (in eval mode, on ``device``) and tokenizer at ``path``: a directory written by
    ``recipes.export`` / ``save_pretrained`` plus the tokenizer's files, or a training run
    (see :func:`recipes.checkpoints.load_weights`). Raises ``FileNotFoundError`` when nothing
    is at ``path`` and ``ValueError`` naming what is missing when it is neither."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no run directory or exported model at {path}")
    try:
        trained = load_weights(path, device)
    except (CheckpointError, DataError) as exc:
        raise ValueError(
            f"{path} is neither a training run (a run directory, its checkpoints/ directory or a step_* checkpoint) "
            f"nor a model written by recipes.export ({CONFIG_NAME} + {WEIGHTS_NAME}): {exc}"
        ) from None
    trained.model.eval()
    return trained.model, trained.tokenizer


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _pick_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        # lm_eval's command line asks for cuda:0 unless told otherwise; its HF model falls back too
        warnings.warn(f"device {device} asked for, but CUDA is not available: evaluating on the CPU", stacklevel=3)
        return torch.device("cpu")
    return device


@register_model("spherenet")
class SphereNetLM(TemplateLM):
    """An NGPT or GPT and its tokenizer behind lm_eval's ``LM`` interface.

    Arguments (``--model_args key=value,...``): ``path`` (a training run or an exported
    directory), ``device`` (default: cuda when available), ``batch_size`` (sequences per
    forward pass), ``dtype`` (``auto`` keeps the stored dtype; ``float32``, ``bfloat16``,
    ``float16``), ``max_length`` (tokens per forward pass, at most and by default the model's
    ``max_seq_len``), ``max_gen_toks`` (generation length when a task gives none), ``seed``
    (for sampled generation). ``model`` and ``tokenizer`` may be given instead of ``path``.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        model: nn.Module | None = None,
        tokenizer: Tokenizer | None = None,
        device: str | torch.device | None = None,
        batch_size: int | str = 1,
        max_batch_size: int | None = None,  # lm_eval passes it for --batch_size auto, not supported here
        dtype: str = "auto",
        max_length: int | str | None = None,
        max_gen_toks: int | str = 256,
        seed: int | str = 1234,
    ) -> None:
        super().__init__()
        if isinstance(batch_size, str) and batch_size.strip().startswith("auto"):
            raise ValueError("batch_size 'auto' is not supported by the spherenet model: give a number, e.g. 16")
        self._batch_size = _positive_int(batch_size, "batch_size")
        if dtype != "auto" and dtype not in _DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {', '.join(_DTYPES)}, got {dtype!r}")
        self._device = _pick_device(device)
        if path is not None:
            if model is not None or tokenizer is not None:
                raise ValueError("give either path, or model and tokenizer, not both")
            model, tokenizer = load_model_and_tokenizer(path, self._device)
        elif model is None or tokenizer is None:
            raise ValueError("the spherenet model needs path=<run directory or exported model directory>")
        if dtype != "auto":
            model = model.to(_DTYPES[dtype])
        self.model = model.to(self._device).eval()
        self.tokenizer = tokenizer
        config = model.config
        if not config.causal:
            raise ValueError("lm_eval scores text left to right: the model must be causal (it has causal=False)")
        if tokenizer.vocab_size > config.vocab_size:
            raise ValueError(
                f"the tokenizer's vocabulary ({tokenizer.vocab_size}) is larger than the model's "
                f"vocab_size ({config.vocab_size}): they do not belong together"
            )
        self._max_length = config.max_seq_len if max_length is None else _positive_int(max_length, "max_length")
        if self._max_length > config.max_seq_len:
            raise ValueError(f"max_length {self._max_length} exceeds the model's max_seq_len {config.max_seq_len}")
        self.max_gen_toks = _positive_int(max_gen_toks, "max_gen_toks")
        self._generator = torch.Generator(device=self._device).manual_seed(int(seed))
        self._warned_gen_cut = False

    # ------------------------------------------------------------------ what lm_eval asks for

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def tokenizer_name(self) -> str:
        return f"{self.tokenizer.name}-{self.tokenizer.fingerprint[:12]}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer.encode(string)  # spherenet tokenizers add no BOS/EOS

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    # ------------------------------------------------------------------ scoring

    @torch.no_grad()
    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str] | None, list[int], list[int]]],
        disable_tqdm: bool = False,
        cache_as: str | None = "loglikelihood",
    ) -> list[tuple[float, bool]]:
        """``(sum of log p(continuation token | everything before it), whether every
        continuation token is the argmax)`` for each ``(key, context ids, continuation ids)``.

        Each sequence is cut from the left to ``max_length + 1`` tokens (the last is only
        predicted). Sequences are sorted longest first, batched, and right-padded: a causal
        model's logits at a position do not depend on the padding after it.
        """
        scored: list[tuple[int, list[int], int]] = []  # (request index, model input, continuation length)
        for index, (_, context, continuation) in enumerate(requests):
            if len(continuation) > self.max_length:
                raise ValueError(
                    f"a continuation of {len(continuation)} tokens does not fit in max_length={self.max_length}"
                )
            whole = (context + continuation)[-(self.max_length + 1) :]
            if len(whole) < 2:
                raise ValueError("a request needs at least one context token and one continuation token")
            scored.append((index, whole, len(continuation)))
        scored.sort(key=lambda item: -len(item[1]))

        results: list[tuple[float, bool] | None] = [None] * len(requests)
        batches = range(0, len(scored), self.batch_size)
        for start in tqdm(batches, desc="spherenet loglikelihood", disable=disable_tqdm or self.rank != 0):
            batch = scored[start : start + self.batch_size]
            width = len(batch[0][1]) - 1  # the longest model input in the batch
            inputs = torch.full((len(batch), width), self.eot_token_id, dtype=torch.long)
            for row, (_, whole, _) in enumerate(batch):
                inputs[row, : len(whole) - 1] = torch.tensor(whole[:-1])
            logits = self.model(inputs.to(self.device))
            for row, (index, whole, n_continuation) in enumerate(batch):
                end = len(whole) - 1  # logits at positions end - n .. end - 1 predict the continuation
                if n_continuation == 0:
                    answer = (0.0, True)
                else:
                    log_probs = F.log_softmax(logits[row, end - n_continuation : end].float(), dim=-1)
                    targets = torch.tensor(whole[-n_continuation:], device=log_probs.device)
                    total = log_probs.gather(-1, targets[:, None]).sum()
                    answer = (float(total), bool((log_probs.argmax(dim=-1) == targets).all()))
                results[index] = answer
                key = requests[index][0]
                if cache_as is not None and key is not None:
                    self.cache_hook.add_partial(cache_as, key, answer)
        return results  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each whole document (``Instance.args == (text,)``), its first
        token conditioned on the end-of-text id. A document longer than ``max_length`` is
        cut into disjoint windows of predicted tokens, each window's input filled up with the
        tokens before it (``lm_eval.utils.get_rolling_token_windows``)."""
        windows: list[tuple[None, list[int], list[int]]] = []
        owners: list[int] = []
        for index, request in enumerate(requests):
            (text,) = request.args
            for context, continuation in map(
                make_disjoint_window,
                get_rolling_token_windows(
                    token_list=self.tok_encode(text),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                ),
            ):
                windows.append((None, context, continuation))
                owners.append(index)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm, cache_as=None)
        totals = [0.0] * len(requests)
        for index, (log_prob, _) in zip(owners, scores):
            totals[index] += log_prob
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # ------------------------------------------------------------------ generation

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Continue each context (``Instance.args == (context, gen_kwargs)``) until one of the
        ``until`` strings appears, the end-of-text id is produced, or ``max_gen_toks`` tokens
        are made; returns the text before the first stop string. Greedy unless ``do_sample``.

        Requests with the same context length and generation settings are decoded together with
        the model's KV cache (no padding: the model takes no attention mask).
        """
        prepared = []
        for index, request in enumerate(requests):
            context, gen_kwargs = request.args
            options = normalize_gen_kwargs(dict(gen_kwargs or {}), default_max_gen_toks=self.max_gen_toks)
            until = [s for s in options.get("until") or [] if s]  # "" would stop at once
            max_new = min(options["max_gen_toks"], self.max_length - 1)
            if max_new < options["max_gen_toks"] and not self._warned_gen_cut:
                log.warning("max_gen_toks %d cut to %d to fit max_length", options["max_gen_toks"], max_new)
                self._warned_gen_cut = True
            temperature = float(options.get("temperature") or 0.0) if options.get("do_sample") else 0.0
            top_k = int(options["top_k"]) if options.get("top_k") else None
            ids = (self.tok_encode(context) or [self.prefix_token_id])[-(self.max_length - max_new) :]
            settings = (tuple(until), max_new, temperature, top_k)
            prepared.append((index, ids, settings))
        # same length and settings -> one batch; longest first
        prepared.sort(key=lambda item: (-len(item[1]), repr(item[2])))
        groups: list[list[tuple[int, list[int], tuple]]] = []
        for item in prepared:
            last = groups[-1] if groups else None
            if last and len(last) < self.batch_size and len(last[0][1]) == len(item[1]) and last[0][2] == item[2]:
                last.append(item)
            else:
                groups.append([item])

        results: list[str | None] = [None] * len(requests)
        for group in tqdm(groups, desc="spherenet generate_until", disable=disable_tqdm or self.rank != 0):
            until, max_new, temperature, top_k = group[0][2]
            prompts = torch.tensor([ids for _, ids, _ in group], dtype=torch.long, device=self.device)
            texts = self._generate(prompts, list(until), max_new, temperature, top_k)
            for (index, _, _), text in zip(group, texts):
                results[index] = text
                self.cache_hook.add_partial("generate_until", requests[index].args, text)
        return results  # type: ignore[return-value]

    @torch.no_grad()
    def _generate(
        self, prompts: torch.Tensor, until: list[str], max_new: int, temperature: float, top_k: int | None
    ) -> list[str]:
        """Decode ``prompts`` (``(B, T)``, same length) with a KV cache, as
        :func:`spherenet.models.generation.generate` does, stopping each row at a stop string or
        the end-of-text id; rows that stopped keep being fed (their tokens are discarded)."""
        caches = [KVCache() for _ in self.model.blocks]
        logits = self.model(prompts, kv_caches=caches)[:, -1, :]
        made: list[list[int]] = [[] for _ in range(prompts.shape[0])]
        texts = [""] * prompts.shape[0]
        done = [False] * prompts.shape[0]
        for step in range(max_new):
            next_ids = sample_next_token(logits, temperature, top_k, self._generator)
            for row, token in enumerate(next_ids[:, 0].tolist()):
                if done[row]:
                    continue
                if token == self.eot_token_id:
                    done[row] = True
                    continue
                made[row].append(token)
                texts[row] = self.tok_decode(made[row])
                done[row] = any(stop in texts[row] for stop in until)
            if all(done) or step + 1 == max_new:
                break
            logits = self.model(next_ids, kv_caches=caches)[:, -1, :]
        for row, text in enumerate(texts):
            for stop in until:  # cut at the earliest stop string
                text = text.split(stop)[0]
            texts[row] = text
        return texts
