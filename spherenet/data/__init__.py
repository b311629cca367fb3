"""Data for spherenet: tokenizers, dataset preparation into token files, and training windows.

Typical use::

    from spherenet.data import prepare_dataset

    data = prepare_dataset("stdlib", "byte", "data")           # cached after the first call
    train = data.windows("train", block_size=256, batch_size=32, seed=0, rank=rank, world_size=ws)
    x, y = train.next_batch()                                  # int64, (32, 256) each
    for x, y in data.windows("val", block_size=256, batch_size=32).eval_batches(): ...

``datasets`` is imported only when data is prepared, so training code that reads prepared files
does not pay for it.
"""

from ._files import check_text_file, file_sha256
from ._hub import hub_offline, hub_unreachable
from ._staging import process_alive
from .errors import DataError, DataFileNotFoundError, TokenizerError
from .prepare import default_corpus, prepare_dataset
from .prepared import PreparedData, load_prepared, token_dtype
from .sources import DEFAULT_STDLIB_BYTES, SOURCE_KINDS, Source, load_documents, resolve_source, stdlib_files
from .tokenizer import build_tokenizer, load_pretrained, load_tokenizer, train_bpe
from .tokenizer_classes import ByteTokenizer, HFTokenizer, Tokenizer
from .windows import TokenWindows

__all__ = [
    "DEFAULT_STDLIB_BYTES",
    "SOURCE_KINDS",
    "ByteTokenizer",
    "DataError",
    "DataFileNotFoundError",
    "HFTokenizer",
    "PreparedData",
    "Source",
    "TokenWindows",
    "Tokenizer",
    "TokenizerError",
    "build_tokenizer",
    "check_text_file",
    "default_corpus",
    "file_sha256",
    "hub_offline",
    "hub_unreachable",
    "load_documents",
    "load_prepared",
    "load_pretrained",
    "load_tokenizer",
    "prepare_dataset",
    "process_alive",
    "resolve_source",
    "stdlib_files",
    "token_dtype",
    "train_bpe",
]
