"""The data side of ``recipes.train``: the tokenizer (loaded before the data is tokenized with
it, so that what depends on its vocabulary is checked first), the prepared dataset (tokenized
once, by rank 0), the batch geometry (micro-batches and accumulation for the global batch) and
each rank's windows."""

from __future__ import annotations

from pathlib import Path

from spherenet.data import Tokenizer, build_tokenizer, prepare_dataset
from spherenet.train.config import ConfigError, RunConfig
from spherenet.train.distributed import barrier

__all__ = [
    "batch_geometry",
    "check_vocabulary",
    "prepare_data",
    "run_tokenizer",
    "run_windows",
    "source_kind",
    "trained_bpe",
]


def batch_geometry(cfg: RunConfig, world_size: int) -> tuple[int, int]:
    """(micro-batch size per rank, gradient-accumulation steps) for the global batch."""
    batch = cfg.train.batch_size
    if batch % world_size:
        raise ConfigError(f"train.batch_size {batch} is not divisible by the world size {world_size}")
    per_rank = batch // world_size
    micro = cfg.train.micro_batch_size or per_rank
    if per_rank % micro:
        raise ConfigError(
            f"train.micro_batch_size {micro} does not divide the per-rank batch {per_rank} "
            f"(train.batch_size {batch} / {world_size} ranks)"
        )
    return micro, per_rank // micro


def source_kind(cfg: RunConfig) -> str | None:
    """The ``kind`` that ``data.format`` names for local source files (None: from the extension)."""
    return None if cfg.data.format == "auto" else cfg.data.format


def trained_bpe(spec: str) -> bool:
    """``bpe:<vocab size>``: a tokenizer trained on the run's data, never a given one."""
    kind, _, arg = spec.partition(":")
    return kind.strip().lower() == "bpe" and arg.strip().isdigit()


def run_tokenizer(cfg: RunConfig) -> Tokenizer | None:
    """``data.tokenizer``, loaded before the data is tokenized with it; None for a BPE that the
    preparation trains on the data (``bpe:<vocab size>``)."""
    return None if trained_bpe(cfg.data.tokenizer) else build_tokenizer(cfg.data.tokenizer)


def check_vocabulary(cfg: RunConfig, tokenizer: Tokenizer) -> None:
    """A model vocabulary (``model.vocab_size``) too small for the tokenizer's ids: refused, naming both."""
    model_vocab = cfg.model.build(tokenizer.vocab_size).vocab_size
    if model_vocab < tokenizer.vocab_size:
        raise ConfigError(
            f"model.vocab_size={model_vocab} is smaller than the vocabulary of data.tokenizer={cfg.data.tokenizer} "
            f"({tokenizer.vocab_size} ids): set model.vocab_size to at least {tokenizer.vocab_size}, or leave it "
            "out to take the tokenizer's"
        )


def prepare_data(cfg: RunConfig, is_main: bool, tokenizer: Tokenizer | None = None):
    """The run's :class:`~spherenet.data.PreparedData`, in ``data.cache_dir`` (default: a
    ``data_cache`` beside ``train.out_dir``), tokenized with ``tokenizer`` (``data.tokenizer``
    already loaded) or, when None, with ``data.tokenizer`` as named."""
    d = cfg.data
    tokenizer = d.tokenizer if tokenizer is None else tokenizer
    cache = Path(d.cache_dir) if d.cache_dir else Path(cfg.train.out_dir).parent / "data_cache"
    kwargs = dict(
        kind=source_kind(cfg),
        text_field=d.text_field,
        text_unit=d.text_unit,
        hub_config=d.subset or None,
        hub_split=d.split,
        max_documents=d.max_docs or None,
        val_fraction=d.val_fraction,
        seed=d.seed,
        num_proc=d.num_proc,
        skip_bad_records=d.skip_bad_records,
    )
    # Rank 0 tokenizes; the others wait, then read the cached files.
    if is_main:
        data = prepare_dataset(d.source, tokenizer, cache, progress=cfg.train.progress, **kwargs)
    barrier()
    if not is_main:
        data = prepare_dataset(d.source, tokenizer, cache, **kwargs)
    bad = data.meta.get("bad_records") or {}
    if is_main and bad.get("skip") and data.meta["source"]["kind"] in ("json", "parquet", "hub"):  # on every run
        first = "".join(f"; {n['count']} in {w}, the first at {n['first']}" for w, n in bad["files"].items())
        print(f"data: skipped {bad['skipped']} records without usable text (data.skip_bad_records){first}", flush=True)
    return data


def run_windows(data, cfg: RunConfig, info, micro: int, accum: int, vocab_size: int):
    """This rank's (train, val) windows of ``train.block_size`` tokens. One train draw per step
    is this rank's share of the global batch (split into micro-batches by the loop), so the data
    position is the step (global batches), whatever the micro-batch or world size."""
    common = dict(
        block_size=cfg.train.block_size,
        seed=cfg.train.seed,
        rank=info.rank,
        world_size=info.world_size,
        vocab_size=vocab_size,
    )
    return data.windows("train", batch_size=micro * accum, **common), data.windows("val", batch_size=micro, **common)
