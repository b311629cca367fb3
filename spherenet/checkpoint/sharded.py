"""The FSDP2 (``fully_shard``) model and optimizer, saved and loaded through
torch.distributed.checkpoint (DCP) into the checkpoint's ``sharded/`` directory, each rank its
own shards."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from torch import nn

from .distributed import _Group
from .format import SHARDED_DIR, _all_files, _describe
from .state import _keep_python_scalars, _load_optimizer


def _state_dicts_for_save(inner, optimizer, sharded, optim_empty):
    if not sharded:
        return inner.state_dict(), (optimizer.state_dict() if optimizer is not None else None)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    # get_state_dict() "initializes" an optimizer that has no state yet by running a step
    # with lr=0: that would change the trajectory (Adam's step count) of the live run. So
    # an optimizer without state is saved as its param_groups only (in state.pt).
    if optimizer is None or optim_empty:
        return get_model_state_dict(inner), None
    return get_state_dict(inner, [optimizer])


def _save_sharded(tmp: Path, msd, osd, g: _Group, process_group) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    payload = {"model": msd}
    if osd is not None:
        payload["optimizer"] = osd
    dcp.save(payload, checkpoint_id=str(tmp / SHARDED_DIR), process_group=process_group)
    # dcp.save returns once every rank's shards and the .metadata are written (fsync'ed
    # by DCP's FileSystemWriter). Hash the files, each rank a share.
    names = _all_files(tmp / SHARDED_DIR)
    mine, err = {}, None
    try:
        for rel in names[g.rank :: g.world]:
            mine[f"{SHARDED_DIR}/{rel}"] = _describe(tmp, f"{SHARDED_DIR}/{rel}")
    except Exception as e:  # noqa: BLE001
        err = e
    g.agree(err, "hashing checkpoint shards", path=tmp / SHARDED_DIR)
    files: dict[str, Any] = {}
    for part in g.gather(mine):
        files.update(part)
    return files


def _model_sd_for_fingerprint(inner: nn.Module, backend: str):
    if backend == "dcp":
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(inner)
    return inner.state_dict()


def _load_sharded(path: Path, inner: nn.Module, optimizer, rest: dict, process_group) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    with_optim = optimizer is not None and not rest["optimizer_empty"]
    if with_optim:
        # Note: on an optimizer without state this runs a zero-lr step to create it; the
        # state is then overwritten below and the parameters reloaded after it.
        msd, osd = get_state_dict(inner, [optimizer])
        # Parameters that never had a gradient have no optimizer state in the checkpoint;
        # the template above gives every parameter one. Ask DCP only for what was saved.
        saved = dcp.FileSystemReader(str(path / SHARDED_DIR)).read_metadata().state_dict_metadata
        prefixes = {key.rsplit(".", 1)[0] for key in saved if key.startswith("optimizer.state.")}
        osd["state"] = {fqn: st for fqn, st in osd["state"].items() if f"optimizer.state.{fqn}" in prefixes}
        payload = {"model": msd, "optimizer": osd}
    else:
        msd = get_model_state_dict(inner)
        payload = {"model": msd}
    with warnings.catch_warnings():
        # DCP warns when used without a process group (loading a sharded checkpoint into
        # one process); that is intended here.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(payload, checkpoint_id=str(path / SHARDED_DIR), process_group=process_group)
    if with_optim:
        set_model_state_dict(inner, payload["model"])
        # strict=False: parameters without saved state (never had a gradient) start fresh,
        # as they would have in the uninterrupted run.
        set_optimizer_state_dict(inner, [optimizer], payload["optimizer"], options=StateDictOptions(strict=False))
        _keep_python_scalars(optimizer, payload["optimizer"]["state"], dict(inner.named_parameters()))
    else:
        set_model_state_dict(inner, payload["model"])
        if optimizer is not None:  # saved before its first step: hyperparameters only
            _load_optimizer(optimizer, rest["optimizer_groups"], path)
