"""Checkpoints that survive crashes: atomic, verified, finite, and exact on resume.

One checkpoint is one directory ``<directory>/step_<step:08d>/``::

    state.pt        torch.save of everything that is not sharded: the model and optimizer
                    (single process / DDP), other stateful objects (scheduler, ...), plain
                    values (data-loader position, config, ...) and the RNG states of every rank
    sharded/        FSDP2 only: the model and optimizer, written by torch.distributed.checkpoint
                    (DCP), each rank its own shards
    <extra files>   optional, given to ``save(..., files=...)``: e.g. the model's config and
                    the tokenizer, so that a checkpoint directory is self-contained
    MANIFEST.json   written last: step, backend, world size, model fingerprint (parameter and
                    buffer names, shapes, dtypes), and the size and sha256 of every other file

How a save stays atomic: everything is written into ``<directory>/.tmp-step_<step>`` (same
parent, hence same filesystem), each file fsync'ed, the manifest last, then the directory is
renamed to its final name and the parent fsync'ed. A crash at any point leaves either the
complete new checkpoint or only a ``.tmp-*`` directory, which no load ever reads and the next
save deletes. Older checkpoints are pruned (``keep_last``) only after the new one is in place.

How a load stays safe: the manifest and every file's size and sha256 are checked first. A
damaged checkpoint raises :class:`CheckpointCorruptError`; :meth:`CheckpointManager.latest_verified`
(behind :meth:`~CheckpointManager.load_latest`, and the one way every reader finds "the newest
sound checkpoint") then warns and falls back to the next older one. A checkpoint that does not fit the model raises
:class:`CheckpointMismatchError` naming the differing keys (no fallback: an older checkpoint
would not fit either).

Parameters are loaded in place (``load_state_dict`` without ``assign``, i.e. ``copy_``), so a
``geoopt.ManifoldParameter`` stays one and the optimizer keeps the very tensors it updates; the
load checks that afterwards.

Distributed: with a process group, every rank must call ``save``/``load*`` together. Plain
values and stateful objects other than the model/optimizer are taken from rank 0; RNG states
are gathered from every rank and each rank gets its own back. Collectives use
``all_gather_object``, so with NCCL ``torch.cuda.set_device`` must have been called.
"""

from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointWarning,
    NonFiniteStateError,
    describe_os_error,
)
from .format import (
    FORMAT_VERSION,
    MANIFEST,
    RUN_CHECKPOINTS,
    SHARDED_DIR,
    STATE_FILE,
    VerifiedCheckpoint,
    holds_checkpoints,
    verify_files_manifest,
    write_files_manifest,
)
from .manager import CheckpointManager, LoadedCheckpoint
from .state import check_finite_weights, model_fingerprint

__all__ = [
    "describe_os_error",
    "CheckpointManager",
    "LoadedCheckpoint",
    "VerifiedCheckpoint",
    "CheckpointError",
    "CheckpointCorruptError",
    "CheckpointMismatchError",
    "NonFiniteStateError",
    "CheckpointWarning",
    "model_fingerprint",
    "check_finite_weights",
    # a manifest (size and sha256 of each file) for any directory, e.g. an exported model
    "write_files_manifest",
    "verify_files_manifest",
    # the on-disk format: its version and the names a checkpoint directory uses itself
    "FORMAT_VERSION",
    "MANIFEST",
    "STATE_FILE",
    "SHARDED_DIR",
    # what shows a training run's checkpoints in a directory (the recipes' checkpoints/ folder)
    "RUN_CHECKPOINTS",
    "holds_checkpoints",
]
