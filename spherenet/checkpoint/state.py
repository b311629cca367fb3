"""What a checkpoint holds: the ``state`` dict given to save and load split into model,
optimizer, stateful objects and plain values; the checks that it can be saved (finite, plain
data) and that it fits the model it is loaded into (the fingerprint); optimizer state loading."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from .distributed import _local
from .errors import CheckpointMismatchError, NonFiniteStateError

_MAX_LISTED = 12  # keys listed per category in a mismatch message


def _unwrap(model: nn.Module) -> nn.Module:
    """The module under DDP / DataParallel / torch.compile wrappers."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile
            model = model._orig_mod
        else:
            return model


def model_fingerprint(model_or_state_dict: nn.Module | Mapping[str, Any]) -> dict[str, list]:
    """``{name: [shape, dtype]}`` for every tensor of a model's state dict (parameters and
    buffers, canonical names without DDP/compile prefixes, global shapes under FSDP2)."""
    if isinstance(model_or_state_dict, nn.Module):
        sd = _unwrap(model_or_state_dict).state_dict()
    else:
        sd = model_or_state_dict
    return {k: [list(v.shape), str(v.dtype)] for k, v in sd.items() if isinstance(v, torch.Tensor)}


def _fmt(entry) -> str:
    shape, dtype = entry
    return f"{tuple(shape)} {dtype.replace('torch.', '')}"


def _section(title: str, keys: list[str], describe) -> list[str]:
    if not keys:
        return []
    lines = [f"  {title}:"] + [f"    {k}: {describe(k)}" for k in keys[:_MAX_LISTED]]
    if len(keys) > _MAX_LISTED:
        lines.append(f"    ... and {len(keys) - _MAX_LISTED} more")
    return lines


def _check_fingerprint(saved: Mapping[str, list], current: Mapping[str, list], path: Path) -> None:
    missing = sorted(set(current) - set(saved))
    unexpected = sorted(set(saved) - set(current))
    differ = sorted(k for k in set(saved) & set(current) if list(saved[k]) != list(current[k]))
    if not (missing or unexpected or differ):
        return
    raise CheckpointMismatchError(
        "\n".join(
            [f"checkpoint {path} does not fit this model:"]
            + _section(
                "shape/dtype differ (checkpoint vs model)", differ, lambda k: f"{_fmt(saved[k])} vs {_fmt(current[k])}"
            )
            + _section("in the model but not in the checkpoint", missing, lambda k: _fmt(current[k]))
            + _section("in the checkpoint but not in the model", unexpected, lambda k: _fmt(saved[k]))
        )
    )


def _float_tensors(obj, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            yield prefix, obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _float_tensors(v, f"{prefix}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _float_tensors(v, f"{prefix}.{i}")


def _nonfinite(tree: Mapping[str, Any]) -> list[str]:
    """Names of floating tensors in ``tree`` holding NaN/inf (local shards only)."""
    named = [(n, _local(t).detach()) for n, t in _float_tensors(tree, "")]
    named = [(n.lstrip("."), t) for n, t in named if t.numel()]
    bad: list[str] = []
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for n, t in named:
        by_device.setdefault(t.device, []).append((n, t))
    for items in by_device.values():
        flags = torch.stack([torch.isfinite(t).all() for _, t in items]).cpu()  # one sync per device
        bad += [n for (n, _), ok in zip(items, flags.tolist()) if not ok]
    return bad


def check_finite_weights(module: nn.Module, where: str) -> None:
    """:class:`NonFiniteStateError` naming every floating tensor of ``module``'s state dict that
    holds NaN or inf: for weights just loaded, which nothing should train from or sample."""
    bad = _nonfinite(module.state_dict())
    if bad:
        shown = ", ".join(map(repr, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise NonFiniteStateError(f"{where}: non-finite weights (NaN/inf) in {shown}")


_PLAIN_LEAVES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)


def _check_plain(obj, where: str) -> None:
    """Refuse values that ``torch.load(weights_only=True)`` could not read back."""
    if isinstance(obj, _PLAIN_LEAVES):
        return
    if isinstance(obj, torch.Tensor):
        if type(obj) not in (torch.Tensor, nn.Parameter):
            raise TypeError(
                f"{where} is a {type(obj).__name__} (a tensor subclass); store a plain tensor "
                "(e.g. t.detach().as_subclass(torch.Tensor))"
            )
        return
    if isinstance(obj, (dict, OrderedDict)):
        for k, v in obj.items():
            if not isinstance(k, (str, int, float, bool, type(None))):
                raise TypeError(f"{where} has a key of type {type(k).__name__}; use str/int keys")
            _check_plain(v, f"{where}[{k!r}]")
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for i, v in enumerate(obj):
            _check_plain(v, f"{where}[{i}]")
        return
    raise TypeError(
        f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}; checkpoint values must be "
        "plain data (dict, list, tuple, str, int, float, bool, None, tensor) so that they load "
        "with torch.load(weights_only=True). Convert it first (e.g. dataclasses.asdict(config))."
    )


def _is_stateful(obj) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _split_state(state: Mapping[str, Any]):
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    bad_keys = [k for k in state if not isinstance(k, str)]
    if bad_keys:
        raise TypeError(f"state keys must be str, got {bad_keys!r}")
    model = state.get("model")
    if not isinstance(model, nn.Module):
        raise TypeError(f"state['model'] must be an nn.Module, got {type(model).__name__}")
    optimizer = state.get("optimizer")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"state['optimizer'] must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    stateful = {k: v for k, v in state.items() if k not in ("model", "optimizer") and _is_stateful(v)}
    values = {k: v for k, v in state.items() if k not in ("model", "optimizer") and k not in stateful}
    return model, optimizer, stateful, values


# --------------------------------------------------------------------------------------------


def _load_optimizer(optimizer: torch.optim.Optimizer, osd: dict, path: Path) -> None:
    try:
        optimizer.load_state_dict(osd)
    except (ValueError, KeyError) as e:
        raise CheckpointMismatchError(f"checkpoint {path}: optimizer state does not fit this optimizer ({e})") from e
    saved_ids = [i for g in osd["param_groups"] for i in g["params"]]
    live = [p for g in optimizer.param_groups for p in g["params"]]
    _keep_python_scalars(optimizer, osd["state"], dict(zip(saved_ids, live)))


def _keep_python_scalars(optimizer: torch.optim.Optimizer, saved_state: Mapping, key_to_param: Mapping) -> None:
    """Give back the python int/float type of per-parameter optimizer state entries.

    ``Optimizer.load_state_dict`` runs ``__setstate__``, and torch's ``Adam.__setstate__`` turns
    a python-int ``step`` into a float32 tensor. geoopt's ``RiemannianAdam`` (a subclass) keeps
    ``step`` as an int and computes ``betas[0] ** step`` from it, so after the conversion the
    bias corrections are computed in float32 and the resumed run drifts (~1e-7 per step) from
    an uninterrupted one. Restoring the saved type keeps the resume bitwise exact.
    """
    for key, saved in saved_state.items():
        param = key_to_param.get(key)
        if param is None or param not in optimizer.state or not isinstance(saved, Mapping):
            continue
        live = optimizer.state[param]
        for name, value in saved.items():
            python_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if python_number and isinstance(live.get(name), torch.Tensor):
                live[name] = value
