"""Pretrained ``tokenizer.json`` files behind :class:`~spherenet.data.tokenizer_classes.HFTokenizer`:
from a local path, from the bytes of a directory's files already read (a checkpoint's, read once
while it is pinned), or from a Hub repository (e.g. the LLaMA-2 tokenizer of the paper) when the
machine has network. :mod:`spherenet.data.tokenizer` builds every tokenizer family on top of this."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._files import existing_file
from ._hub import hub_endpoint, hub_offline, hub_unreachable
from .errors import DataError, DataFileNotFoundError, TokenizerError
from .tokenizer_classes import TOKENIZER_CONFIG, TOKENIZER_JSON, HFTokenizer

__all__ = ["load_pretrained"]


def load_pretrained(
    name_or_path: str | os.PathLike,
    *,
    revision: str | None = None,
    token: str | None = None,
    eos_token: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    timeout: float = 5.0,
    kind: str = "hf",
    files: Mapping[str, bytes] | None = None,
) -> HFTokenizer:
    """Load a pretrained ``tokenizer.json``: a local file, a directory holding one, or a Hub repo id.

    Hub ids (e.g. ``"meta-llama/Llama-2-7b-hf"``, the paper's 32k tokenizer; gated, needs an
    ``HF_TOKEN``) are fetched with ``huggingface_hub`` into its usual cache; a cached copy is used
    without network. Without network the call fails within about ``timeout`` seconds with a
    :class:`TokenizerError` that says how to pass a local ``tokenizer.json`` instead.

    ``files`` (file name -> bytes) are the files of the directory holding the ``tokenizer.json``
    at path ``name_or_path``, already read: the tokenizer (and the ``tokenizer_config.json`` that
    may name its EOS) is built from them, not from the disk, with the same ``origin`` and the
    same errors as a load of that path.
    """
    from tokenizers import Tokenizer as _Tok

    text = os.fspath(name_or_path)
    p = Path(text).expanduser()
    if files is not None:
        return _from_bytes(p, files, kind=kind, eos_token=eos_token)
    looks_local = (
        isinstance(name_or_path, os.PathLike)
        or text.startswith((".", "/", "~"))
        or text.endswith(".json")
        or p.exists()
    )
    if looks_local:
        if p.is_dir():
            if not (p / TOKENIZER_JSON).is_file():
                extra = (
                    " (a SentencePiece tokenizer.model must first be converted to tokenizer.json)"
                    if (p / "tokenizer.model").exists()
                    else ""
                )
                raise DataFileNotFoundError(f"no {TOKENIZER_JSON} in directory {p}{extra}")
            p = p / TOKENIZER_JSON
        f = existing_file(p, "tokenizer file")
        try:
            tok = _Tok.from_file(str(f))
        except Exception as exc:
            raise TokenizerError(f"{f} is not a valid tokenizer.json: {_short(exc)}") from None
        if eos_token is None:
            eos_token = _configured_eos(f.parent / TOKENIZER_CONFIG)
        return HFTokenizer(tok, kind=kind, origin={"path": str(f)}, eos_token=eos_token)

    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", text):
        raise TokenizerError(
            f"{text!r} is neither an existing tokenizer.json path nor a Hub repository id like 'owner/name'"
        )
    local = _hub_tokenizer_file(text, revision=revision, token=token, cache_dir=cache_dir, timeout=timeout)
    try:
        tok = _Tok.from_file(local)
    except Exception as exc:
        raise TokenizerError(f"tokenizer.json of Hub repo {text} could not be parsed: {_short(exc)}") from None
    return HFTokenizer(tok, kind=kind, origin={"name": text, "revision": revision}, eos_token=eos_token)


def _from_bytes(p: Path, files: Mapping[str, bytes], *, kind: str, eos_token: str | None) -> HFTokenizer:
    """The tokenizer of the file ``p`` whose directory's files were read into ``files``: what
    :func:`load_pretrained` gives for ``p`` on the disk, origin and errors alike."""
    from tokenizers import Tokenizer as _Tok

    content = files.get(p.name)
    if content is None:  # the checks of existing_file, on bytes already read
        raise DataFileNotFoundError(f"tokenizer file not found: {p}")
    if not content:
        raise DataError(f"tokenizer file {p} is empty (0 bytes)")
    f = p.resolve()
    try:
        tok = _Tok.from_str(bytes(content).decode("utf-8"))
    except Exception as exc:
        raise TokenizerError(f"{f} is not a valid tokenizer.json: {_short(exc)}") from None
    if eos_token is None:
        eos_token = _configured_eos(f.parent / TOKENIZER_CONFIG, files)
    return HFTokenizer(tok, kind=kind, origin={"path": str(f)}, eos_token=eos_token)


def _configured_eos(config_file: Path, files: Mapping[str, bytes] | None = None) -> str | None:
    """The ``eos_token`` a transformers ``tokenizer_config.json`` beside a tokenizer.json names
    (a string, or an added-token object with ``content``); None when there is none to read.
    ``files``: the directory's files already read, taken instead of the disk."""
    try:
        raw = config_file.read_bytes() if files is None else files[config_file.name]
        eos = json.loads(bytes(raw).decode("utf-8")).get("eos_token")
    except (OSError, KeyError, ValueError, AttributeError):
        return None  # no such file, or not a JSON object: the tokenizer's own tokens decide
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) and eos else None


def _hub_tokenizer_file(repo: str, *, revision: str | None, token: str | None, cache_dir: Any, timeout: float) -> str:
    how = (
        f"To use it without network, download its {TOKENIZER_JSON} on a machine that has network "
        f"(e.g. `hf download {repo} {TOKENIZER_JSON} --local-dir DIR`) and pass the path: "
        f"'hf:DIR/{TOKENIZER_JSON}'. Offline alternatives: 'byte' or 'bpe:<vocab size>'."
    )
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:  # pragma: no cover - huggingface_hub ships with datasets
        hf_hub_download = None
    if hf_hub_download is not None:
        kw = dict(
            repo_id=repo,
            filename=TOKENIZER_JSON,
            revision=revision,
            token=token,
            cache_dir=None if cache_dir is None else str(cache_dir),
        )
        try:
            return hf_hub_download(**kw, local_files_only=True)  # already cached: no network needed
        except Exception:
            pass
        if hub_offline():
            raise TokenizerError(
                f"cannot fetch tokenizer '{repo}': offline mode is on (HF_HUB_OFFLINE) and it is not in the "
                f"local Hugging Face cache. {how}"
            )
    reason = hub_unreachable(timeout)
    if reason is not None:
        raise TokenizerError(
            f"cannot fetch tokenizer '{repo}' from the Hugging Face Hub ({hub_endpoint()}): no network "
            f"({reason}). {how}"
        )
    if hf_hub_download is None:  # pragma: no cover
        from tokenizers import Tokenizer as _Tok

        try:
            tok = _Tok.from_pretrained(repo, revision=revision or "main", token=token)
        except Exception as exc:
            raise TokenizerError(f"cannot fetch tokenizer '{repo}' from the Hub: {_short(exc)}. {how}") from None
        tmp = Path(cache_dir or Path.home() / ".cache" / "spherenet") / re.sub(r"\W+", "-", repo) / TOKENIZER_JSON
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tok.save(str(tmp))
        return str(tmp)
    try:
        return hf_hub_download(**kw, etag_timeout=timeout)
    except Exception as exc:
        cls = type(exc).__name__
        if cls == "GatedRepoError":
            why = "it is a gated repository: accept its licence on the Hub and set HF_TOKEN"
        elif cls == "RepositoryNotFoundError":
            why = "no such repository (or it is private: set HF_TOKEN)"
        elif cls in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
            why = f"the repository has no {TOKENIZER_JSON}"
        elif cls == "RevisionNotFoundError":
            why = f"no revision {revision!r}"
        else:
            why = _short(exc)
        raise TokenizerError(f"cannot fetch tokenizer '{repo}' from the Hugging Face Hub: {why}. {how}") from None


def _short(exc: BaseException, limit: int = 300) -> str:
    msg = " ".join(str(exc).split()) or type(exc).__name__
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."
