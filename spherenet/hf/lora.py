"""LoRA for spherenet's models: a sphere-aware LoRA that keeps nGPT on the sphere, and a plain one.

A plain LoRA adds ``B A`` to a weight; nGPT's matrices are unit vectors along their
d_model-sized side (:class:`spherenet.layers.SphereLinear`), and ``W + B A`` is not. The
sphere-aware LoRA puts the adapted matrix back on the sphere along the same axis:
``Norm(W + s B A)`` (rows for ``sphere="in"``, columns of ``(out, in)`` for ``sphere="out"``),
in the forward pass and when merged, so that a merged model is an nGPT again (unit rows, same
logits). The plain LoRA of a SphereLinear uses ``W + s B A`` as it is (a baseline).

peft's own ``target_modules="all-linear"`` sees ``nn.Linear`` layers only (GPT's projections,
not nGPT's SphereLinear); :func:`sphere_lora_config` resolves ``"all-linear"`` for both models:

    from peft import get_peft_model
    from spherenet.hf.lora import sphere_lora_config

    model = get_peft_model(model, sphere_lora_config(model, r=8))  # every attention and MLP projection

needs peft (``pip install "spherenet-torch[hf]"``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from peft import LoraConfig
from peft.tuners.lora.layer import Linear as LoraLinear
from peft.tuners.lora.layer import LoraLayer
from torch import nn

from .. import kernels
from ..layers import SphereLinear

__all__ = [
    "SphereLoraConfig",
    "adapter_config",
    "SphereLoraLinear",
    "PlainSphereLoraLinear",
    "sphere_lora_config",
    "all_linear_names",
    "merged_state_dict",
    "ALL_LINEAR",
]

#: ``target_modules`` value meaning every attention and MLP projection (all linear maps but the output layer)
ALL_LINEAR = "all-linear"
#: peft's name of an adapter's config file
ADAPTER_CONFIG_NAME = "adapter_config.json"
#: :attr:`SphereLoraConfig.spherenet_lora` values: the LoRA layer of a SphereLinear
SPHERE_AWARE, PLAIN = "sphere-aware", "plain"


class SphereLoraLinear(LoraLinear):
    """LoRA of a :class:`SphereLinear`: ``Norm(W + sum of s B A)`` along the weight's sphere axis."""

    sphere_aware = True

    def __init__(self, base_layer: nn.Module, adapter_name: str, config: LoraConfig, r: int = 0, lora_alpha=1, **kw):
        if config.lora_dropout:
            raise ValueError("LoRA of a SphereLinear adapts the weight, not the input: lora_dropout must be 0")
        nn.Module.__init__(self)
        LoraLayer.__init__(self, base_layer, **kw)
        self.fan_in_fan_out = False
        self.is_target_conv_1d_layer = False
        self._active_adapter = adapter_name
        self._unmerged_weights: list[torch.Tensor] = []
        self.update_layer(adapter_name, r, lora_alpha=lora_alpha, config=config, **kw)

    def _get_in_out_features(self, module: nn.Module) -> tuple[int, int]:
        return module.in_features, module.out_features  # a SphereLinear's (peft knows torch's layers only)

    def _on_sphere(self, matrix: torch.Tensor) -> torch.Tensor:
        """``matrix`` ``(out, in)`` with unit vectors along the base weight's sphere axis."""
        if not self.sphere_aware:
            return matrix
        if self.get_base_layer().sphere == "in":
            return kernels.normalize(matrix)  # unit rows
        return kernels.normalize(matrix.t()).t()  # unit columns: the rows of the stored (in, out) weight

    def adapted_matrix(self, adapter_names) -> torch.Tensor:
        """The base matrix ``(out, in)`` plus the adapters' ``s B A``, back on the sphere."""
        matrix = self.get_base_layer().matrix()
        for name in adapter_names:
            if name in self.lora_A:
                matrix = matrix + self.get_delta_weight(name).to(matrix.dtype)
        return self._on_sphere(matrix)

    def forward(self, x: torch.Tensor, out_scale: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        base = self.get_base_layer()
        if self.disable_adapters or self.merged or not any(a in self.lora_A for a in self.active_adapters):
            return base(x, out_scale=out_scale)
        matrix = self.adapted_matrix(self.active_adapters).to(x.dtype)
        return F.linear(x, matrix) if out_scale is None else kernels.scaled_linear(x, matrix, out_scale)

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        """Write the adapted matrix (``Norm(W + s B A)``: unit rows again, for the sphere-aware
        LoRA) into the base weight; keeps ``W`` for unmerge."""
        names = [
            n for n in (adapter_names or self.active_adapters) if n in self.lora_A and n not in self.merged_adapters
        ]
        if not names:
            return
        base = self.get_base_layer()
        with torch.no_grad():
            matrix = self.adapted_matrix(names)
            if safe_merge and not bool(torch.isfinite(matrix).all()):
                raise ValueError(f"NaNs in the merged weight of adapters {names}")
            self._unmerged_weights.append(base.weight.detach().clone())
            base.weight.copy_(matrix if base.sphere == "in" else matrix.t())
        self.merged_adapters.extend(names)

    def unmerge(self) -> None:
        """Restore the weight before the last merge (a normalization cannot be subtracted)."""
        if not self.merged:
            return
        with torch.no_grad():
            self.get_base_layer().weight.copy_(self._unmerged_weights.pop())
        self.merged_adapters.clear()


class PlainSphereLoraLinear(SphereLoraLinear):
    """Plain LoRA of a :class:`SphereLinear`: ``W + sum of s B A``, left off the sphere (merged
    too), with the layer's output scaling as in the sphere-aware one."""

    sphere_aware = False


def all_linear_names(model: nn.Module) -> list[str]:
    """Names of every linear map of ``model`` (:class:`SphereLinear` and ``nn.Linear``) but its
    output layer (``get_output_embeddings()`` / ``embed_out``): the attention and MLP projections."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else model.embed_out
    return sorted(
        name
        for name, module in model.named_modules()
        if isinstance(module, (SphereLinear, nn.Linear)) and module is not output and "lora_" not in name
    )


def sphere_lora_config(
    model: nn.Module, target_modules: str | list[str] = ALL_LINEAR, sphere_aware: bool = True, **lora_kwargs
) -> LoraConfig:
    """A :class:`peft.LoraConfig` for spherenet's ``model`` (nGPT or GPT, spherenet's or its
    transformers class): ``target_modules`` ``"all-linear"`` (every attention and MLP
    projection, :func:`all_linear_names`) or module names as peft takes them; a
    :class:`SphereLinear` gets :class:`SphereLoraLinear` (``sphere_aware``) or
    :class:`PlainSphereLoraLinear`, an ``nn.Linear`` peft's LoRA. ``lora_kwargs`` as in
    ``LoraConfig`` (``r``, ``lora_alpha``, ...); ``lora_dropout`` is 0 for a SphereLinear."""
    has_sphere = any(isinstance(m, SphereLinear) for m in model.modules())
    if sphere_aware and not has_sphere:
        raise ValueError(
            f"{type(model).__name__} has no SphereLinear to adapt (sphere-aware LoRA is for nGPT); "
            "pass sphere_aware=False for a plain LoRA"
        )
    if isinstance(target_modules, str):
        if target_modules.lower() != ALL_LINEAR:
            raise ValueError(f"target_modules must be {ALL_LINEAR!r} or a list of module names, got {target_modules!r}")
        target_modules = all_linear_names(model)
    if has_sphere:
        lora_kwargs.setdefault("lora_dropout", 0.0)
    return SphereLoraConfig(
        target_modules=list(target_modules), spherenet_lora=SPHERE_AWARE if sphere_aware else PLAIN, **lora_kwargs
    )


@dataclasses.dataclass
class SphereLoraConfig(LoraConfig):
    """A :class:`peft.LoraConfig` with spherenet's LoRA layer registered for :class:`SphereLinear`
    (:class:`SphereLoraLinear` for ``spherenet_lora="sphere-aware"``, :class:`PlainSphereLoraLinear`
    for ``"plain"``). peft saves ``spherenet_lora`` in adapter_config.json (with the other fields)
    but not the registration; :func:`adapter_config` reads both back."""

    spherenet_lora: str = dataclasses.field(
        default=SPHERE_AWARE, metadata={"help": f"the LoRA layer of a SphereLinear: {SPHERE_AWARE!r} or {PLAIN!r}"}
    )

    def __post_init__(self):
        super().__post_init__()
        if self.spherenet_lora not in (SPHERE_AWARE, PLAIN):
            raise ValueError(f"spherenet_lora must be {SPHERE_AWARE!r} or {PLAIN!r}, got {self.spherenet_lora!r}")
        layer = SphereLoraLinear if self.spherenet_lora == SPHERE_AWARE else PlainSphereLoraLinear
        self._register_custom_module({SphereLinear: layer})


def adapter_config(adapter: str | os.PathLike) -> SphereLoraConfig | None:
    """The :class:`SphereLoraConfig` of a LoRA adapter directory (its adapter_config.json, as
    ``save_pretrained`` wrote it), with spherenet's LoRA layer registered: what
    ``PeftModel.from_pretrained(base, adapter, config=...)`` and
    ``AutoPeftModelForCausalLM.from_pretrained(adapter, config=...)`` need for nGPT.
    ``spherenet_lora`` absent (an adapter saved before it was recorded, or by peft's own
    ``LoraConfig``): the sphere-aware layer, :func:`sphere_lora_config`'s default. None for a path
    that is not a local directory with an adapter_config.json, or for another PEFT method than LoRA."""
    config_file = Path(adapter).expanduser() / ADAPTER_CONFIG_NAME
    if not config_file.is_file():
        return None
    try:
        values = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {config_file}: {exc}") from None
    if not isinstance(values, dict) or values.get("peft_type") != "LORA":
        return None
    fields = {f.name for f in dataclasses.fields(SphereLoraConfig) if f.init}
    unknown = sorted(set(values) - fields)
    if unknown:  # a newer peft's fields, as peft itself treats them
        warnings.warn(f"{config_file}: field(s) {unknown} are not LoraConfig's in this peft; ignored", stacklevel=2)
    try:
        return SphereLoraConfig(**{k: v for k, v in values.items() if k in fields})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{config_file}: {exc}") from None


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict ``model`` (with LoRA layers) would have after ``merge_and_unload()``,
    computed without changing it: each adapted layer's weight is its adapted matrix (of the
    active adapters; back on the sphere for the sphere-aware LoRA), under the base layer's name;
    the adapters' own tensors are left out."""
    state = {}
    for key, value in model.state_dict().items():
        if "lora_" not in key:
            state[key.replace(".base_layer.", ".")] = value
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            base = module.get_base_layer()
            active = [a for a in module.active_adapters if a in module.lora_A]
            if isinstance(module, SphereLoraLinear):
                matrix = module.adapted_matrix(active)
                weight = matrix if base.sphere == "in" else matrix.t()
            else:
                weight = base.weight + sum(module.get_delta_weight(a).to(base.weight.dtype) for a in active)
            state[f"{name}.weight"] = weight.detach().as_subclass(torch.Tensor)
    return state
