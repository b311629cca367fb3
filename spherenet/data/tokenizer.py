"""Tokenizers behind one small interface, all usable offline.

Three families:

* :class:`ByteTokenizer` -- the UTF-8 bytes of the text. ``"byte"`` has a vocabulary of 256 and
  uses id 255 as the end-of-text (EOS) id: the byte 0xFF never occurs in UTF-8, so the id can never
  be confused with text. ``"byte:257"`` instead adds a separate id 256 for EOS.
* BPE trained locally with the ``tokenizers`` library (:func:`train_bpe`): byte-level BPE with
  one special token ``<|endoftext|>`` as EOS.
* Pretrained ``tokenizer.json`` files (:func:`load_pretrained`, in
  :mod:`spherenet.data.tokenizer_pretrained`): from a local path, or from a Hub repository (e.g.
  the LLaMA-2 tokenizer of the paper) when the machine has network.

Every tokenizer encodes *plain text*: special-token strings that appear inside a document (say
a literal ``"<|endoftext|>"``) are encoded as ordinary text, never as the EOS id. Document
separation is done by the data pipeline, which appends ``eos_id`` after every document.
``decode`` drops EOS and other special ids and replaces invalid UTF-8 with U+FFFD.

:meth:`Tokenizer.spec` is a small JSON-able dict that records which tokenizer was used (a
checkpoint can store it); :func:`build_tokenizer` rebuilds the tokenizer from it, and
:meth:`Tokenizer.save` / :func:`load_tokenizer` store a self-contained copy in a directory.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._files import check_text_file
from .errors import DataFileNotFoundError, TokenizerError
from .tokenizer_classes import BPE_EOS, SPEC_FILE, TOKENIZER_JSON, ByteTokenizer, HFTokenizer, Tokenizer
from .tokenizer_pretrained import _short, load_pretrained

__all__ = [
    "SPEC_FILE",
    "ByteTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "build_tokenizer",
    "load_pretrained",
    "load_tokenizer",
    "train_bpe",
]


def train_bpe(
    data: Iterable[str] | Sequence[str | os.PathLike],
    vocab_size: int,
    *,
    files: bool | None = None,
    min_frequency: int = 2,
    eos_token: str = BPE_EOS,
    length: int | None = None,
) -> HFTokenizer:
    """Train a byte-level BPE tokenizer offline with the ``tokenizers`` library.

    ``data`` is an iterable of documents (str), or a sequence of paths to UTF-8 text files
    (``files=True``, or detected when every item is a ``pathlib.Path``). The vocabulary
    is the 256 bytes, ``eos_token``, and merges up to ``vocab_size`` ids in all; a corpus too small
    to find that many merges gives fewer, with a warning. ``length`` (number of documents) only
    feeds the progress estimate.
    """
    from tokenizers import Tokenizer as _Tok
    from tokenizers import decoders, models, pre_tokenizers, trainers

    vocab_size = _as_int(vocab_size, "BPE vocab_size")
    floor = 256 + 1
    if vocab_size < floor:
        raise TokenizerError(
            f"BPE vocab_size {vocab_size} is too small: byte-level BPE needs at least {floor} (256 bytes + EOS)"
        )
    if files is None and isinstance(data, Sequence) and not isinstance(data, str) and len(data) > 0:
        files = all(isinstance(x, os.PathLike) for x in data)
    if isinstance(data, (str, os.PathLike)):
        raise TokenizerError("train_bpe expects an iterable of documents or a list of file paths, not a single string")

    tok = _Tok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[eos_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    if files:
        paths = [str(check_text_file(p, "BPE training file")) for p in data]  # type: ignore[union-attr]
        tok.train(paths, trainer)
        origin: dict[str, Any] = {"trained_on": [Path(p).name for p in paths]}
    else:
        seen = {"docs": 0}

        def docs() -> Iterator[str]:
            for t in data:  # type: ignore[union-attr]
                if not isinstance(t, str):
                    raise TokenizerError(f"BPE training data must be text (str), got {type(t).__name__}")
                seen["docs"] += 1
                yield t

        tok.train_from_iterator(docs(), trainer, length=length)
        if seen["docs"] == 0:
            raise TokenizerError("BPE training data is empty: no documents were given")
        origin = {}
    got = tok.get_vocab_size(with_added_tokens=True)
    if got <= floor:
        raise TokenizerError("BPE training found no merges: the training text is empty or too small")
    if got < vocab_size:
        warnings.warn(
            f"BPE training reached a vocabulary of {got}, less than the {vocab_size} asked for: the "
            "training text is too small",
            stacklevel=2,
        )
    return HFTokenizer(tok, kind="bpe", origin=origin, eos_token=eos_token)


def _as_int(value: Any, what: str) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        out = int(value)
        if isinstance(value, float) and out != value:
            raise ValueError
        return out
    except (TypeError, ValueError):
        raise TokenizerError(f"{what} must be an integer, got {value!r}") from None


def load_tokenizer(directory: str | os.PathLike, files: Mapping[str, bytes] | None = None) -> Tokenizer:
    """Load a tokenizer written by :meth:`Tokenizer.save` (or a prepared-data directory).

    ``files`` (file name -> bytes): the directory's files, already read; the spec and the
    ``tokenizer.json`` then come from them, not from the disk, so that the tokenizer is built
    from exactly these bytes (a checkpoint's, read once while it is pinned). The tokenizer, its
    ``origin`` and fingerprint, and the errors are the same as for the directory on the disk."""
    d = Path(directory).expanduser()
    spec_file = d / SPEC_FILE
    has = (lambda name: (d / name).is_file()) if files is None else (lambda name: name in files)
    if not has(SPEC_FILE):
        if has(TOKENIZER_JSON):
            return load_pretrained(d / TOKENIZER_JSON, files=files)
        raise DataFileNotFoundError(f"no {SPEC_FILE} in {d}: not a directory written by Tokenizer.save()")
    try:
        raw = spec_file.read_bytes() if files is None else files[SPEC_FILE]
        spec = json.loads(bytes(raw).decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot read tokenizer spec {spec_file}: {_short(exc)}") from None
    return build_tokenizer(spec, base_dir=d, files=files)


def build_tokenizer(
    spec: str | os.PathLike | Mapping[str, Any] | Tokenizer,
    *,
    train_data: Iterable[str] | None = None,
    base_dir: str | os.PathLike | None = None,
    timeout: float = 5.0,
    files: Mapping[str, bytes] | None = None,
) -> Tokenizer:
    """Build a tokenizer from a spec.

    Strings: ``"byte"`` (vocab 256, EOS 255), ``"byte:257"`` (vocab 257, EOS 256),
    ``"bpe:<vocab size>"`` (trained on ``train_data``; :func:`~spherenet.data.prepare_dataset`
    trains it on the train split), ``"bpe:<path to tokenizer.json>"``, ``"hf:<hub id>"`` or
    ``"hf:<path to tokenizer.json or its directory>"``; a directory written by
    :meth:`Tokenizer.save`. Dicts: the output of :meth:`Tokenizer.spec` (relative paths resolve
    against ``base_dir``; a recorded ``fingerprint`` must match; ``files``, the files of ``base_dir``
    already read, give a ``path`` that names one of them, see :func:`load_tokenizer`). A
    :class:`Tokenizer` is returned as is.
    """
    if isinstance(spec, Tokenizer):
        return spec
    if isinstance(spec, Mapping):
        return _from_dict(spec, base_dir=base_dir, timeout=timeout, train_data=train_data, files=files)
    if isinstance(spec, os.PathLike):
        return load_tokenizer(spec)
    if not isinstance(spec, str):
        raise TokenizerError(f"tokenizer spec must be a string, dict or Tokenizer, got {type(spec).__name__}")
    s = spec.strip()
    kind, _, arg = s.partition(":")
    kind = kind.lower()
    if kind == "byte":
        if arg in ("", "256"):
            return ByteTokenizer()
        if arg == "257":
            return ByteTokenizer(extra_eos=True)
        raise TokenizerError(
            f"unknown byte tokenizer {s!r}: use 'byte' (vocab 256, EOS id 255) or 'byte:257' (EOS id 256)"
        )
    if kind == "bpe":
        if not arg:
            raise TokenizerError("'bpe' needs a vocabulary size or a path: 'bpe:8192' or 'bpe:/path/tokenizer.json'")
        if arg.isdigit():
            if train_data is None:
                raise TokenizerError(
                    f"{s!r} asks for a BPE tokenizer to be trained, which needs text: pass train_data=..., "
                    "or give it to prepare_dataset(), which trains it on the train split"
                )
            return train_bpe(train_data, int(arg))
        return load_pretrained(arg, kind="bpe", timeout=timeout)
    if kind in ("hf", "hub", "pretrained"):
        if not arg:
            raise TokenizerError(
                f"{s!r} needs a Hub id or a path, e.g. 'hf:meta-llama/Llama-2-7b-hf' or 'hf:/path/tokenizer.json'"
            )
        return load_pretrained(arg, timeout=timeout)
    p = Path(s).expanduser()
    if p.is_dir() and (p / SPEC_FILE).is_file():
        return load_tokenizer(p)
    raise TokenizerError(
        f"unknown tokenizer spec {spec!r}: expected 'byte', 'byte:257', 'bpe:<vocab size or "
        "tokenizer.json>', "
        "'hf:<hub id or tokenizer.json>', or a directory written by Tokenizer.save()"
    )


def _from_dict(
    spec: Mapping[str, Any], *, base_dir: Any, timeout: float, train_data: Any, files: Mapping[str, bytes] | None
) -> Tokenizer:
    kind = str(spec.get("kind", "")).lower()
    if kind == "byte":
        vocab = spec.get("vocab_size", 256)
        if vocab not in (256, 257):
            raise TokenizerError(f"byte tokenizer spec has vocab_size {vocab!r}; expected 256 or 257")
        return ByteTokenizer(extra_eos=vocab == 257)
    if kind not in ("bpe", "hf"):
        raise TokenizerError(
            f"unknown tokenizer kind {spec.get('kind')!r} in spec {dict(spec)}; expected 'byte', 'bpe' or 'hf'"
        )
    eos_token = spec.get("eos_token")
    path = spec.get("path")
    if path is not None:
        p = Path(path).expanduser()
        in_base_dir = not p.is_absolute() and len(p.parts) == 1  # a file of base_dir, which files holds
        if not p.is_absolute() and base_dir is not None:
            p = Path(base_dir) / p
        mine = files if in_base_dir and base_dir is not None else None  # a path elsewhere is read from the disk
        tok = load_pretrained(p, kind=kind, eos_token=eos_token, files=mine)
        if "name" in spec or "original_path" in spec or "trained_on" in spec:
            tok.origin = {k: spec[k] for k in ("name", "revision", "original_path", "trained_on") if k in spec}
            tok.origin["path"] = str(p.resolve())
    elif spec.get("name"):
        tok = load_pretrained(
            str(spec["name"]), revision=spec.get("revision"), kind=kind, eos_token=eos_token, timeout=timeout
        )
    elif kind == "bpe" and spec.get("vocab_size") is not None:
        if train_data is None:
            raise TokenizerError("a BPE spec without a path needs train_data to train on")
        return train_bpe(train_data, spec["vocab_size"], eos_token=eos_token or BPE_EOS)
    else:
        raise TokenizerError(f"tokenizer spec {dict(spec)} has neither 'path' nor 'name'")
    want = spec.get("fingerprint")
    if want and want != tok.fingerprint:
        raise TokenizerError(
            f"tokenizer loaded from {spec.get('path') or spec.get('name')} differs from the one recorded "
            f"(fingerprint {tok.fingerprint[:12]} != recorded {str(want)[:12]}): the data or checkpoint was "
            "made with another tokenizer"
        )
    return tok
