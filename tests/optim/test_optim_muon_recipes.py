"""The Muon recipes ("spherical_muon", "muon"): how they split nGPT and GPT, which matrices they
take, their refusals and config keys, a run resumed from a checkpoint (in-process and through
recipes/train.py) equal to the straight run, and FSDP2 with rows sharded over 2 gloo ranks.
SphericalMuon and CombinedOptimizer themselves: test_optim_muon.py."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo import WORLD, spawn, step_beside_reference
from torch import nn

from spherenet.checkpoint import CheckpointManager
from spherenet.layers import SphereClassifier, SphereEmbedding
from spherenet.manifolds import declare_sphere
from spherenet.models import NGPTBlock, NGPTConfig
from spherenet.models.presets import from_preset
from spherenet.optim import (
    CombinedOptimizer,
    RiemannianAdam,
    SphericalMuon,
    build_optimizer,
    param_groups,
    sphere_parameters,
)
from spherenet.optim.muon import hidden_matrices
from spherenet.train.config import ConfigError, load_config

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------
# the recipes


def tiny(preset: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return from_preset(preset, vocab_size=32, max_seq_len=16, d_model=16, n_heads=2, n_layers=2)


def lm_batches(n: int, seed: int = 3, distinct: int = 2):
    """``n`` batches cycling over ``distinct`` random ones (so that there is something to learn)."""
    g = torch.Generator().manual_seed(seed)
    pool = [torch.randint(0, 32, (4, 17), generator=g) for _ in range(distinct)]
    return [pool[i % distinct] for i in range(n)]


def lm_step(model, opt, sched, ids) -> float:
    loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()
    return loss.item()


def test_spherical_muon_recipe_splits_ngpt_and_trains_on_the_sphere():
    model = tiny("ngpt-tiny")
    opt, sched = build_optimizer(model, "spherical_muon", lr=3e-3, muon_lr=2e-2, total_steps=30)
    muon, adam = opt.optimizers
    assert isinstance(muon, SphericalMuon) and isinstance(adam, RiemannianAdam)
    in_muon = set(muon.param_groups[0]["param_names"])
    blocks_2d = {n for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2}
    assert in_muon == blocks_2d and len(in_muon) == 2 * 7  # W_q, W_k, W_v, W_o, W_u, W_v, W_o_mlp per block
    in_adam = {n for g in adam.param_groups for n in g["param_names"]}
    assert {"embed_in.weight", "embed_out.weight"} <= in_adam and not in_adam & in_muon
    assert in_adam | in_muon == {n for n, _ in model.named_parameters()}
    assert all(g["weight_decay"] == 0 for g in opt.param_groups)
    assert muon.param_groups[0]["lr"] == 2e-2 and adam.param_groups[0]["lr"] == 3e-3
    losses = [lm_step(model, opt, sched, ids) for ids in lm_batches(25)]
    assert sum(losses[-5:]) < sum(losses[:5]) - 0.5, losses
    assert max(float((p.detach().norm(dim=-1) - 1).abs().max()) for p in sphere_parameters(model)) < 1e-5


def test_muon_recipe_splits_gpt():
    model = tiny("gpt-tiny")
    opt, sched = build_optimizer(model, "muon", lr=3e-3, total_steps=30, warmup_steps=2)
    muon, adamw = opt.optimizers
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    group = muon.param_groups[0]
    assert group["initial_lr"] == 3e-3 and group["weight_decay"] == 0.1 and group["adjust_lr_fn"] == "match_rms_adamw"
    assert set(group["param_names"]) == {
        n for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2
    }
    decayed = {n for g in adamw.param_groups if g["weight_decay"] > 0 for n in g["param_names"]}
    assert decayed == {"embed_in.weight", "embed_out.weight"}
    losses = [lm_step(model, opt, sched, ids) for ids in lm_batches(25)]
    assert sum(losses[-5:]) < sum(losses[:5]) - 0.5, losses


class _Encoder(nn.Module):
    """A model of spherenet's layers under names of its own (no ``blocks``, no ``embed_out``)."""

    def __init__(self, vocab=32, d=16, classes=3):
        super().__init__()
        self.tokens = SphereEmbedding(vocab, d)
        config = NGPTConfig(vocab_size=vocab, n_layers=2, d_model=d, n_heads=2, d_mlp=32, causal=False)
        self.encoder = nn.ModuleList(NGPTBlock(config) for _ in range(2))
        self.head = SphereClassifier(d, classes)

    def forward(self, ids):
        h = self.tokens(ids)
        for block in self.encoder:
            h = block(h)
        return self.head(h.mean(1))


def test_muon_takes_the_hidden_matrices_by_declaration_and_shape_not_by_name():
    model = _Encoder()
    opt, _ = build_optimizer(model, "spherical_muon", lr=3e-3, total_steps=10)
    muon, adam = opt.optimizers
    in_muon = set(muon.param_groups[0]["param_names"])
    encoder_2d = {n for n, p in model.named_parameters() if n.startswith("encoder.") and p.dim() == 2}
    assert in_muon == encoder_2d and len(in_muon) == 2 * 7
    in_adam = {n for g in adam.param_groups for n in g["param_names"]}
    assert {"tokens.weight", "head.weight.weight"} <= in_adam  # the lookup table and the output layer
    # nGPT and GPT: the same split as their blocks' 2-D weights, found without the name "blocks"
    for preset in ("ngpt-tiny", "gpt-tiny"):
        lm = tiny(preset)
        expected = {n for n, p in lm.named_parameters() if n.startswith("blocks.") and p.dim() == 2}
        assert {n for n, _ in hidden_matrices(lm)} == expected
    # a plain torch model: nn.Embedding is a table; an output layer is named by get_output_embeddings
    plain = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.Linear(4, 10))
    plain.get_output_embeddings = lambda: plain[2]
    assert [n for n, _ in hidden_matrices(plain)] == ["1.weight"]


def test_spherical_muon_takes_only_the_hidden_matrices_declared_on_the_sphere():
    """A hidden matrix off the sphere goes to Adam with the tables and the output layer; Muon holds
    only the sphere's, and refusals still name the method before the settings."""
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 10))
    model.get_output_embeddings = lambda: model[3]
    declare_sphere(model[1])
    opt, _ = build_optimizer(model, "spherical_muon", lr=1e-3, total_steps=10)
    muon, adam = opt.optimizers
    assert muon.param_groups[0]["param_names"] == ["1.weight"]
    in_adam = {n for g in adam.param_groups for n in g["param_names"]}
    assert in_adam == {n for n, _ in model.named_parameters()} - {"1.weight"}
    with pytest.raises(ValueError, match="method 'muon' on a model with sphere parameters \\('1.weight'"):
        build_optimizer(model, "muon", lr=-1.0, total_steps=10)


def test_muon_recipes_refuse_the_wrong_model_and_bad_values():
    with pytest.raises(ValueError, match="'muon' on a model with sphere parameters.*spherical_muon"):
        build_optimizer(tiny("ngpt-tiny"), "muon", lr=1e-3, total_steps=10, warmup_steps=0)
    with pytest.raises(ValueError, match="no hidden 2-D sphere weights for Muon"):
        build_optimizer(tiny("gpt-tiny"), "spherical_muon", lr=1e-3, total_steps=10)
    with pytest.raises(ValueError, match="muon_lr must be > 0"):
        build_optimizer(tiny("ngpt-tiny"), "spherical_muon", lr=1e-3, muon_lr=0.0, total_steps=10)
    with pytest.raises(ValueError, match="muon_momentum must be in \\[0, 1\\)"):
        build_optimizer(tiny("ngpt-tiny"), "spherical_muon", lr=1e-3, muon_momentum=1.0, total_steps=10)


@pytest.mark.parametrize("preset,method", [("ngpt-tiny", "spherical_muon"), ("gpt-tiny", "muon")])
def test_checkpoint_resume_equals_continuous_run(tmp_path, preset, method):
    """3 steps, save (CheckpointManager, as recipes/train.py), load into a fresh model and
    optimizer, 3 more steps == 6 steps straight."""

    def make():
        model = tiny(preset)
        opt, sched = build_optimizer(model, method, lr=3e-3, muon_lr=1e-2, total_steps=6, warmup_steps=1)
        return model, opt, sched

    data = lm_batches(6)
    straight = make()
    for ids in data:
        lm_step(*straight, ids)

    first = make()
    for ids in data[:3]:
        lm_step(*first, ids)
    manager = CheckpointManager(tmp_path)
    manager.save(3, {"model": first[0], "optimizer": first[1], "scheduler": first[2]})
    resumed = make()
    assert manager.load_latest({"model": resumed[0], "optimizer": resumed[1], "scheduler": resumed[2]}).step == 3
    for ids in data[3:]:
        lm_step(*resumed, ids)
    for (name, p), q in zip(straight[0].named_parameters(), resumed[0].parameters()):
        assert torch.equal(p, q), name


def test_config_accepts_the_muon_methods_and_checks_their_keys():
    cfg = load_config(None, ["optim.method=spherical_muon", "optim.muon_lr=0.02", "optim.muon_momentum=0.9"])
    assert (cfg.optim.method, cfg.optim.muon_lr, cfg.optim.muon_momentum) == ("spherical_muon", 0.02, 0.9)
    assert load_config(None, ["optim.method=muon"]).optim.muon_lr is None  # unset: optim.lr
    with pytest.raises(ConfigError, match="optim.muon_lr must be > 0"):
        load_config(None, ["optim.muon_lr=0"])
    with pytest.raises(ConfigError, match="optim.muon_momentum must be in \\[0, 1\\), got 1.0"):
        load_config(None, ["optim.muon_momentum=1.0"])
    with pytest.raises(ConfigError, match="optim.method = 'sphere_muon' is not one of"):
        load_config(None, ["optim.method=sphere_muon"])


# ---------------------------------------------------------------------------------------------
# FSDP2: rows sharded over 2 gloo ranks; Newton-Schulz on the gathered matrix


def _make_combined(model):
    hidden = [(n, p) for n, p in param_groups(model)[0]["params"] if n in ("q.weight", "o.weight")]
    rest = [
        dict(g, params=[(n, p) for n, p in g["params"] if n not in ("q.weight", "o.weight")])
        for g in param_groups(model)
    ]
    muon = SphericalMuon([{"params": hidden}], lr=0.05, ns_dtype="float64")
    return CombinedOptimizer([muon, RiemannianAdam([g for g in rest if g["params"]], lr=3e-2)], model=model)


def _fsdp_worker(rank: int) -> None:
    from optim_helpers import Tiny, loss_of
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from spherenet.optim import normalize_

    mesh = init_device_mesh("cpu", (WORLD,))
    g = torch.Generator().manual_seed(7)
    data = [
        (torch.randint(0, 13, (WORLD, 2, 6), generator=g), torch.randint(0, 13, (WORLD, 2, 6), generator=g))
        for _ in range(6)
    ]
    torch.manual_seed(0)
    ref = Tiny(hidden=7).double()  # q, o: 7 rows over 2 ranks, uneven (4/3)
    normalize_(ref)
    model = copy.deepcopy(ref)
    for name in ("emb", "q", "o", "out"):
        fully_shard(getattr(model, name), mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert isinstance(model.q.weight, DTensor)
    opt, ref_opt = _make_combined(model), _make_combined(ref)
    for ids, tgt in data:
        step_beside_reference(rank, loss_of, model, opt, ref, ref_opt, ids, tgt)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        full = p.full_tensor() if isinstance(p, DTensor) else p
        assert float((full - q).abs().max()) <= 1e-10, name
    for p in sphere_parameters(model):
        local = p.detach().to_local()
        assert local.numel() == 0 or float((local.norm(dim=-1) - 1).abs().max()) <= 1e-12


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_sharded_rows_step_like_the_whole_matrix():
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    spawn(_fsdp_worker)


# ---------------------------------------------------------------------------------------------
# recipes/train.py: a run split by a checkpoint equals the straight run


@pytest.mark.parametrize("preset,method", [("ngpt-tiny", "spherical_muon"), ("gpt-tiny", "muon")])
def test_train_cli_resume_continues_exactly(tmp_path, preset, method):
    import json

    from recipes.train import cli

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"paragraph {i}: the unit sphere holds every row. " * 4 for i in range(60)))
    common = [
        f"model.preset={preset}",
        "model.max_seq_len=16",
        "model.n_layers=1",
        f"optim.method={method}",
        "optim.warmup_steps=1",
        "optim.muon_lr=0.02",
        "train.batch_size=4",
        "train.steps=6",
        "train.log_every=1",
        "train.eval_every=3",
        "train.eval_batches=1",
        "train.checkpoint_every=3",
        "train.sample_tokens=0",
        "train.progress=false",
        f"data.source={corpus}",
        f"data.cache_dir={tmp_path / 'cache'}",
    ]

    def losses(out):
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in records if "loss" in r}

    assert cli([*common, f"train.out_dir={tmp_path / 'straight'}"]) == 0
    assert cli([*common, f"train.out_dir={tmp_path / 'split'}", "train.halt_after=3"]) == 0
    assert cli([*common, f"train.out_dir={tmp_path / 'split'}", "--resume"]) == 0
    straight, split = losses(tmp_path / "straight"), losses(tmp_path / "split")
    assert sorted(split) == list(range(1, 7))
    assert all(split[s] == straight[s] for s in range(1, 7)), (straight, split)
