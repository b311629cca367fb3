"""The tokenizer classes: :class:`Tokenizer` (the interface), :class:`ByteTokenizer` and
:class:`HFTokenizer` (a ``tokenizers`` library tokenizer: BPE trained locally or a pretrained
``tokenizer.json``). :mod:`spherenet.data.tokenizer` builds, trains and loads them; the module
docstring there describes the families and the plain-text encoding rules."""

from __future__ import annotations

import abc
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import TokenizerError

__all__ = ["SPEC_FILE", "TOKENIZER_JSON", "BPE_EOS", "ByteTokenizer", "HFTokenizer", "Tokenizer"]

SPEC_FILE = "tokenizer_spec.json"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"  # transformers' tokenizer settings, eos_token among them
BPE_EOS = "<|endoftext|>"
# Special tokens that mark the end of a document in common tokenizer.json files, in order of preference.
_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]", "<|im_end|>")
# the vocabulary of the byte tokenizer's tokenizer.json (ByteTokenizer.tokenizer_json) and its end-of-text token
_BYTE_VOCAB = {f"<0x{i:02X}>": i for i in range(256)}
_BYTE_EOS = "<0xFF>"


class Tokenizer(abc.ABC):
    """The interface every spherenet tokenizer offers.

    Attributes (read-only properties): ``name`` (short, file-name safe), ``vocab_size`` (ids are
    ``0 .. vocab_size-1``), ``eos_id`` (appended after every document when preparing data).
    """

    @property
    @abc.abstractmethod
    def name(self) -> str: ...

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def eos_id(self) -> int: ...

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no EOS added)."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; EOS and other special ids are dropped."""

    @abc.abstractmethod
    def spec(self) -> dict[str, Any]:
        """A JSON-able description that :func:`build_tokenizer` turns back into this tokenizer."""

    def tokenizer_json(self) -> str:
        """This tokenizer as a Hugging Face ``tokenizer.json`` (``tokenizers`` / ``transformers``
        load it); exports write it beside the spec."""
        raise NotImplementedError(f"{type(self).__name__} has no tokenizer.json form")

    @property
    @abc.abstractmethod
    def fingerprint(self) -> str:
        """A hex digest that changes whenever the text -> ids mapping changes."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Like :meth:`encode_batch` but returns int64 arrays (the fast path used by data preparation)."""
        return [np.asarray(ids, dtype=np.int64) for ids in self.encode_batch(texts)]

    def save(self, directory: str | os.PathLike) -> Path:
        """Write a self-contained copy into ``directory`` (``tokenizer_spec.json`` and, for
        ``tokenizers``-based ones, ``tokenizer.json``); returns the spec file's path."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        files = self.to_files()
        for name, text in files.items():  # the spec last: it refers to the others
            if name != SPEC_FILE:
                _atomic_write_text(d / name, text)
        _atomic_write_text(d / SPEC_FILE, files[SPEC_FILE])
        return d / SPEC_FILE

    def to_files(self) -> dict[str, str]:
        """The files :meth:`save` writes, as ``{file name: text}`` (e.g. to store them in a
        checkpoint); written into one directory, :func:`load_tokenizer` reads them back."""
        return {SPEC_FILE: json.dumps(self.spec(), indent=2, sort_keys=True) + "\n"}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as token ids.

    ``ByteTokenizer()`` has ``vocab_size == 256`` and ``eos_id == 255`` (0xFF, a byte that valid
    UTF-8 never contains). ``ByteTokenizer(extra_eos=True)`` has ``vocab_size == 257`` and
    ``eos_id == 256``. Text that cannot be encoded (lone surrogates) becomes ``?``.
    """

    def __init__(self, extra_eos: bool = False) -> None:
        self.extra_eos = bool(extra_eos)

    @property
    def name(self) -> str:
        return "byte257" if self.extra_eos else "byte"

    @property
    def vocab_size(self) -> int:
        return 257 if self.extra_eos else 256

    @property
    def eos_id(self) -> int:
        return 256 if self.extra_eos else 255

    def encode(self, text: str) -> list[int]:
        return list(_utf8(text))

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(_utf8(t), dtype=np.uint8).astype(np.int64) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
            bad = int(arr[(arr < 0) | (arr >= self.vocab_size)][0])
            raise TokenizerError(
                f"token id {bad} is out of range for the {self.name} tokenizer (vocab {self.vocab_size})"
            )
        arr = arr[arr != self.eos_id]
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def spec(self) -> dict[str, Any]:
        return {"kind": "byte", "vocab_size": self.vocab_size, "eos_id": self.eos_id}

    def tokenizer_json(self) -> str:
        """The same tokenizer as a ``tokenizer.json`` that ``tokenizers`` and ``transformers`` load:
        a BPE model without merges whose 256 tokens ``<0x00>`` ... ``<0xFF>`` are the bytes (every
        character falls back to its UTF-8 bytes, so token id = byte value), plus
        ``<|endoftext|>`` as id 256 for the 257-token variant."""
        from tokenizers import AddedToken, decoders, models
        from tokenizers import Tokenizer as _Tokenizers

        tok = _Tokenizers(models.BPE(vocab={f"<0x{i:02X}>": i for i in range(256)}, merges=[], byte_fallback=True))
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
        if self.extra_eos:
            tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
        return tok.to_str(pretty=True)

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(f"spherenet-byte-{self.vocab_size}-eos{self.eos_id}".encode()).hexdigest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteTokenizer) and other.extra_eos == self.extra_eos

    def __hash__(self) -> int:
        return hash(("byte", self.extra_eos))


def _utf8(text: str) -> bytes:
    if not isinstance(text, str):
        raise TokenizerError(f"expected text (str) to encode, got {type(text).__name__}")
    return text.encode("utf-8", errors="replace")


class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` (from a ``tokenizer.json``) behind the spherenet interface.

    ``kind`` is ``"bpe"`` for tokenizers trained here and ``"hf"`` for pretrained ones; ``origin``
    records where it came from (``{"path": ...}`` or ``{"name": hub id, "revision": ...}``).
    Encoding never adds the tokenizer's own BOS/EOS (``add_special_tokens=False``) and treats
    special-token strings inside the text as text.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        kind: str = "hf",
        origin: Mapping[str, Any] | None = None,
        eos_token: str | None = None,
        label: str | None = None,
    ) -> None:
        if kind not in ("hf", "bpe"):
            raise TokenizerError(f"HFTokenizer kind must be 'hf' or 'bpe', got {kind!r}")
        self._tok = tokenizer
        self.kind = kind
        self.origin = dict(origin or {})
        self._label = label or self.origin.get("name") or self.origin.get("path") or kind
        self.eos_token = eos_token if eos_token is not None else _find_eos(tokenizer, self._label)
        eos = tokenizer.token_to_id(self.eos_token)
        if eos is None:
            raise TokenizerError(f"EOS token {self.eos_token!r} is not in the vocabulary of tokenizer {self._label}")
        self._eos_id = int(eos)
        # Special-token strings inside documents are text, never control ids (tokenizers >= 0.19).
        if hasattr(tokenizer, "encode_special_tokens"):
            tokenizer.encode_special_tokens = True
        self._fingerprint: str | None = None

    @property
    def backend(self) -> Any:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._tok

    @property
    def name(self) -> str:
        if self.kind == "bpe":
            return f"bpe{self.vocab_size}"
        base = self.origin.get("name") or Path(str(self.origin.get("path", "hf"))).parent.name or "hf"
        return "hf-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", str(base)).strip("-")

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def eos_id(self) -> int:
        return self._eos_id

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TokenizerError(f"expected text (str) to encode, got {type(text).__name__}")
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._encode_batch(texts)]

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int64) for e in self._encode_batch(texts)]

    def _encode_batch(self, texts: Sequence[str]) -> list[Any]:
        texts = list(texts)
        for t in texts:
            if not isinstance(t, str):
                raise TokenizerError(f"expected text (str) to encode, got {type(t).__name__}")
        fast = getattr(self._tok, "encode_batch_fast", None) or self._tok.encode_batch
        return fast(texts, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if i < 0 or i >= self.vocab_size]
        if bad:
            raise TokenizerError(
                f"token id {bad[0]} is out of range for tokenizer {self.name} (vocab {self.vocab_size})"
            )
        # the end-of-text id is dropped even when not a special token (the byte tokenizer's <0xFF>)
        return self._tok.decode([i for i in ids if i != self._eos_id], skip_special_tokens=True)

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = _hf_fingerprint(self._tok)
        return self._fingerprint

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"kind": self.kind, **self.origin}
        spec.update(
            vocab_size=self.vocab_size,
            eos_token=self.eos_token,
            eos_id=self.eos_id,
            fingerprint=self.fingerprint,
        )
        return spec

    def tokenizer_json(self) -> str:
        """The ``tokenizer.json`` this tokenizer was loaded from (or trained into)."""
        return self._tok.to_str(pretty=True)

    def to_files(self) -> dict[str, str]:
        spec = self.spec()
        if "path" in spec:
            spec["original_path"] = spec.pop("path")
        spec["path"] = TOKENIZER_JSON  # relative to the directory holding the spec
        return {
            TOKENIZER_JSON: self.tokenizer_json(),
            SPEC_FILE: json.dumps(spec, indent=2, sort_keys=True) + "\n",
        }

    def __getstate__(self) -> dict[str, Any]:
        # tokenizers.Tokenizer pickles itself as JSON; keep the flag that pickling may lose.
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if hasattr(self._tok, "encode_special_tokens"):
            self._tok.encode_special_tokens = True


def _find_eos(tokenizer: Any, label: str) -> str:
    added = {}
    try:
        added = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()}
    except Exception:  # older tokenizers
        pass
    for cand in _EOS_CANDIDATES:
        if cand in added or tokenizer.token_to_id(cand) is not None:
            return cand
    if tokenizer.get_vocab(with_added_tokens=True) == _BYTE_VOCAB:
        return _BYTE_EOS  # ByteTokenizer().tokenizer_json(): its end-of-text id is the byte 0xFF
    raise TokenizerError(
        f"tokenizer {label} has no end-of-text token (looked for {', '.join(_EOS_CANDIDATES)}); "
        "pass eos_token='<its EOS string>'"
    )


def _hf_fingerprint(tok: Any) -> str:
    """Digest of what decides tokenization: model (vocab, merges), added tokens, normalizer, pre-tokenizer.

    Merges are normalized to pairs, so the digest survives the ``"a b"`` -> ``["a", "b"]`` change of
    the tokenizer.json format between ``tokenizers`` releases.
    """
    j = json.loads(tok.to_str())
    model = dict(j.get("model") or {})
    merges = model.get("merges")
    if isinstance(merges, list):
        model["merges"] = [m.split(" ", 1) if isinstance(m, str) else list(m) for m in merges]
    ident = {
        "model": model,
        "added": sorted((t.get("id"), t.get("content"), bool(t.get("special"))) for t in j.get("added_tokens") or []),
        "normalizer": j.get("normalizer"),
        "pre_tokenizer": j.get("pre_tokenizer"),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
