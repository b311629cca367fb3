"""spherenet.analysis (the nGPT paper's Section 3.2 inspections) and recipes.analyze.

Unit tests use models built here whose answer is known: nGPT at initialization (unit rows,
scalings at their initial values), and matrices with prescribed singular values or covariance.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from recipes import analyze
from recipes.train import cli as train_cli
from spherenet import analysis
from spherenet.data import TokenWindows
from spherenet.models import from_preset

D, H, DK, L, V = 64, 4, 16, 2, 256  # the tiny presets


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # The test machine's cores are shared: a 2-thread LAPACK SVD spin-waits for a busy core and
    # runs ~100x slower than 1 thread on these small matrices.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def ngpt():
    torch.manual_seed(0)
    return from_preset("ngpt-tiny", max_seq_len=16)


@pytest.fixture
def gpt():
    torch.manual_seed(0)
    return from_preset("gpt-tiny", max_seq_len=16)


def _orthonormal_rows(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """``(rows, cols)`` with orthonormal rows (``rows <= cols``), float64."""
    q, _ = torch.linalg.qr(torch.randn(cols, rows, generator=gen, dtype=torch.float64))
    return q.T


# ---------------------------------------------------------------------------------------------
# Fig. 4: embeddings


def test_ngpt_embeddings_have_unit_norms_at_init(ngpt):
    stats = analysis.embedding_stats(ngpt)
    for side in ("input", "output"):
        norms = stats[side]["norms"]
        assert norms.shape == (V,)
        np.testing.assert_allclose(norms, 1.0, atol=1e-6)
        assert abs(stats[side]["summary"]["norm_std"]) < 1e-6
        # unit vectors: every dot product is a cosine
        assert np.all(np.abs(stats[side]["dots"]) <= 1 + 1e-6)


def test_gpt_embeddings_do_not_have_unit_norms(gpt):
    stats = analysis.embedding_stats(gpt)
    for side in ("input", "output"):
        norms = stats[side]["norms"]
        # normal(0, 0.02) rows of size 64: norms near 0.02 * sqrt(64) = 0.16, and they spread
        assert np.all(np.abs(norms - 1) > 0.5)
        assert 0.1 < norms.mean() < 0.25
        assert norms.std() > 1e-3


def test_covariance_eigenvalues_are_the_known_ones_divided_by_the_median(gpt):
    gen = torch.Generator().manual_seed(1)
    lam = np.geomspace(0.01, 10.0, D)
    centered = torch.randn(V, D, generator=gen, dtype=torch.float64)
    centered -= centered.mean(0)
    q, _ = torch.linalg.qr(centered)  # orthonormal, still centred columns
    rotation, _ = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))
    x = math.sqrt(V - 1) * q @ torch.diag(torch.from_numpy(np.sqrt(lam))) @ rotation  # covariance R^T diag(lam) R
    with torch.no_grad():
        gpt.embed_in.weight.copy_(x.float())
    s = analysis.embedding_stats(gpt)["input"]
    expected = np.sort(lam)[::-1]
    np.testing.assert_allclose(s["eigenvalues_raw"], expected, rtol=1e-4)
    np.testing.assert_allclose(s["eigenvalues"], expected / np.median(lam), rtol=1e-4)
    assert np.median(s["eigenvalues"]) == pytest.approx(1.0)
    assert s["summary"]["eig_condition"] == pytest.approx(1000.0, rel=1e-3)


def test_pairwise_dots_all_pairs_or_a_seeded_sample(ngpt):
    rows = ngpt.embed_in.weight.detach().double().numpy()
    exact = analysis.embedding_stats(ngpt)["input"]
    assert exact["pairs_exact"] and exact["dots"].size == V * (V - 1) // 2
    i, j = exact["pairs"].T
    assert np.all(i < j)
    np.testing.assert_allclose(exact["dots"], np.einsum("nd,nd->n", rows[i], rows[j]), atol=1e-12)

    capped = analysis.embedding_stats(ngpt, max_pairs=500, seed=3)["input"]
    assert not capped["pairs_exact"] and capped["dots"].shape == (500,)
    i, j = capped["pairs"].T
    assert np.all(i != j) and i.max() < V and j.max() < V
    np.testing.assert_allclose(capped["dots"], np.einsum("nd,nd->n", rows[i], rows[j]), atol=1e-12)
    again = analysis.embedding_stats(ngpt, max_pairs=500, seed=3)["input"]
    other = analysis.embedding_stats(ngpt, max_pairs=500, seed=4)["input"]
    np.testing.assert_array_equal(again["pairs"], capped["pairs"])
    assert not np.array_equal(other["pairs"], capped["pairs"])


# ---------------------------------------------------------------------------------------------
# Fig. 5: condition numbers


def test_condition_number_of_known_singular_values():
    gen = torch.Generator().manual_seed(2)
    u, _ = torch.linalg.qr(torch.randn(7, 4, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(4, 4, generator=gen, dtype=torch.float64))
    m = u @ torch.diag(torch.tensor([9.0, 3.0, 2.0, 0.5], dtype=torch.float64)) @ v.T
    assert analysis.condition_number(m) == pytest.approx(18.0, rel=1e-12)
    assert analysis.condition_number(m.T.numpy()) == pytest.approx(18.0, rel=1e-12)
    stack = analysis.condition_number(torch.stack([m, 2 * m, torch.eye(7, 4, dtype=torch.float64)]))
    np.testing.assert_allclose(stack, [18.0, 18.0, 1.0], rtol=1e-12)
    singular = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    assert analysis.condition_number(torch.zeros(3, 3)) == math.inf
    assert analysis.condition_number(singular) > 1e6  # rank 1 (rounding may leave a tiny sigma_min)


def test_condition_numbers_per_head_median_and_role_aware_normalization(gpt):
    gen = torch.Generator().manual_seed(3)
    conds = [2.0, 3.0, 5.0, 7.0]  # one per head: median 4
    w_q = torch.cat(
        [torch.diag(torch.linspace(1.0, c, DK, dtype=torch.float64)) @ _orthonormal_rows(DK, D, gen) for c in conds]
    )
    # W_o (out, in): head h writes through input columns h*DK..(h+1)*DK, a (D, DK) block
    w_o = torch.cat(
        [_orthonormal_rows(DK, D, gen).T @ torch.diag(torch.linspace(1.0, c, DK, dtype=torch.float64)) for c in conds],
        dim=1,
    )
    u, _ = torch.linalg.qr(torch.randn(4 * D, D, generator=gen, dtype=torch.float64))
    w_u = u @ torch.diag(torch.linspace(0.5, 6.0, D, dtype=torch.float64))  # singular values 0.5..6
    block = gpt.blocks[1]
    with torch.no_grad():
        block.attn.w_q.weight.copy_(w_q.float())
        block.attn.w_o.weight.copy_(w_o.float())
        block.mlp.w_u.weight.copy_(w_u.float())
    c = analysis.condition_numbers(gpt)
    assert c["n_layers"] == L and c["attn_q"].shape == (L,) and c["attn_q_heads"].shape == (L, H)
    np.testing.assert_allclose(c["attn_q_heads"][1], conds, rtol=1e-5)
    assert c["attn_q"][1] == pytest.approx(4.0, rel=1e-5)
    np.testing.assert_allclose(c["attn_o_heads"][1], conds, rtol=1e-5)
    assert c["mlp_u"][1] == pytest.approx(12.0, rel=1e-5)
    # Unit vectors along the d_model side: rows of W_q's head blocks, *columns* of W_o's. Both
    # become orthonormal, condition number 1; normalizing W_o's rows instead would not give 1.
    n = analysis.condition_numbers(gpt, normalize=True)
    np.testing.assert_allclose(n["attn_q_heads"][1], 1.0, rtol=1e-5)
    np.testing.assert_allclose(n["attn_o_heads"][1], 1.0, rtol=1e-5)
    assert n["normalize"] and not c["normalize"]


def test_ngpt_matrices_are_already_normalized(ngpt):
    raw, renorm = analysis.condition_numbers(ngpt), analysis.condition_numbers(ngpt, normalize=True)
    for key in analysis.CONDITION_KEYS:
        assert np.all(np.isfinite(raw[key])) and np.all(raw[key] >= 1)
        np.testing.assert_allclose(raw[key], renorm[key], rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Fig. 6: eigen learning rates and scalings


def test_ngpt_scalings_equal_the_paper_init_values(ngpt):
    s = analysis.scaling_factors(ngpt)
    assert s["family"] == "ngpt"
    expected = {
        "alpha_A": (0.05, (L, D)),
        "alpha_M": (0.05, (L, D)),
        "s_qk": (1.0, (L, D)),
        "s_u": (1.0, (L, 4 * D)),
        "s_v": (1.0, (L, 4 * D)),
        "s_z": (1.0, (V,)),
    }
    for key, (value, shape) in expected.items():
        assert s[key].shape == shape, key
        np.testing.assert_allclose(s[key], value, rtol=1e-6, err_msg=key)


def test_alpha_is_reported_as_used_in_the_forward_pass():
    torch.manual_seed(0)
    paper = from_preset("ngpt-tiny", max_seq_len=16)
    signed = from_preset("ngpt-tiny", max_seq_len=16, alpha_attn={"absolute": False})
    for model in (paper, signed):
        with torch.no_grad():
            model.blocks[0].residual_attn.alpha.param.neg_()
    assert np.all(analysis.scaling_factors(paper)["alpha_A"][0] == pytest.approx(0.05))  # |alpha| (A.2)
    assert np.all(analysis.scaling_factors(signed)["alpha_A"][0] == pytest.approx(-0.05))
    scalar = analysis.scaling_factors(from_preset("ngpt-tiny", alpha_mlp={"mode": "scalar"}, s_z={"mode": "scalar"}))
    assert scalar["alpha_M"].shape == (L, 1) and scalar["s_z"].shape == (1,)


def test_gpt_scalings_are_its_rmsnorm_gains(gpt):
    with torch.no_grad():
        gpt.blocks[1].norm_mlp.weight.fill_(2.5)
    s = analysis.scaling_factors(gpt)
    assert s["family"] == "gpt" and "alpha_A" not in s
    assert s["rmsnorm_attn"].shape == (L, D) and s["rmsnorm_out"].shape == (D,)
    np.testing.assert_array_equal(s["rmsnorm_attn"], 1.0)
    np.testing.assert_array_equal(s["rmsnorm_mlp"][1], 2.5)
    np.testing.assert_array_equal(s["rmsnorm_mlp"][0], 1.0)


def test_wrapped_models_are_unwrapped_and_other_modules_rejected(ngpt):
    class Wrapper(torch.nn.Module):  # the shape of DDP / FSDP wrappers: the model as .module
        def __init__(self, module):
            super().__init__()
            self.module = module

    assert analysis.scaling_factors(Wrapper(ngpt))["s_z"].shape == (V,)
    assert analysis.condition_numbers(Wrapper(Wrapper(ngpt)))["n_layers"] == L
    with pytest.raises(TypeError, match=r"expected one of the model classes \(GPT, NGPT\), got Linear"):
        analysis.scaling_factors(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------------------------------------
# Appendix A.7: length extrapolation


@pytest.mark.parametrize("name", ["ngpt", "gpt"])
def test_extrapolation_losses_are_finite_and_leave_the_model_alone(request, name):
    model = request.getfixturevalue(name)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tokens = np.random.default_rng(0).integers(0, V, size=700)
    r = analysis.length_extrapolation(model, tokens, 16, (1, 2, 4), batches=2, batch_size=4)
    assert r["contexts"] == [16, 32, 64] and r["tokens"] == 128
    assert r["loss"].shape == (3,) and np.all(np.isfinite(r["loss"]))
    assert np.all(np.abs(r["loss"] - math.log(V)) < 1.0)  # an untrained model is near uniform
    for f, seg, loss in zip(r["factors"], r["loss_by_segment"], r["loss"]):
        assert seg.shape == (f,) and np.mean(seg) == pytest.approx(loss, rel=1e-9)
    # the model is untouched: weights, context limit, training mode
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert model.config.max_seq_len == 16 and model.training
    # at 1x the loss is plain next-token cross entropy over consecutive windows of 16
    x = torch.from_numpy(tokens[:129].astype(np.int64))
    windows = torch.stack([x[i * 16 : i * 16 + 17] for i in range(8)])
    model.eval()
    with torch.no_grad():
        logits = model(windows[:, :-1])
    direct = torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
    assert r["loss"][0] == pytest.approx(float(direct), rel=1e-5)
    # a TokenWindows over the same tokens gives the same numbers
    r2 = analysis.length_extrapolation(model, TokenWindows(tokens, 16, 4), 16, (1, 2, 4), batches=2, batch_size=4)
    np.testing.assert_allclose(r2["loss"], r["loss"], rtol=1e-12)


def test_longer_context_copy_loads_the_same_weights(ngpt):
    long = analysis.with_max_seq_len(ngpt, 64)
    assert long is not ngpt and long.config.max_seq_len == 64 and ngpt.config.max_seq_len == 16
    ids = torch.randint(0, V, (2, 16))
    ngpt.eval()
    with torch.no_grad():
        torch.testing.assert_close(long(ids), ngpt(ids), rtol=0, atol=0)
        assert long(torch.randint(0, V, (1, 64))).shape == (1, 64, V)
        with pytest.raises(ValueError, match="max_seq_len"):
            ngpt(torch.randint(0, V, (1, 64)))


def test_extrapolation_needs_one_long_window(ngpt):
    with pytest.raises(ValueError, match="at least 65 tokens"):
        analysis.length_extrapolation(ngpt, np.arange(40) % V, 16, (1, 2, 4))


# ---------------------------------------------------------------------------------------------
# Plots


def _check_png(path, max_bytes=150_000):
    assert path.is_file() and 1_000 < path.stat().st_size < max_bytes, path
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] > 300 and im.size[1] > 200
        im.verify()


def test_plots_overlay_models_into_small_pngs(tmp_path, ngpt, gpt):
    models = {"nGPT": ngpt, "GPT": gpt}
    tokens = np.random.default_rng(1).integers(0, V, size=300)
    paths = [
        analysis.plot_embeddings({k: analysis.embedding_stats(m) for k, m in models.items()}, tmp_path / "e.png"),
        analysis.plot_condition_numbers(
            {k: analysis.condition_numbers(m) for k, m in models.items()},
            tmp_path / "c.png",
            normalized={"GPT": analysis.condition_numbers(gpt, normalize=True)},
        ),
        analysis.plot_scalings({k: analysis.scaling_factors(m) for k, m in models.items()}, tmp_path / "s.png"),
        analysis.plot_extrapolation(
            {k: analysis.length_extrapolation(m, tokens, 16, batches=1, batch_size=4) for k, m in models.items()},
            tmp_path / "sub" / "x.png",
        ),
    ]
    for path in paths:
        _check_png(path)


# ---------------------------------------------------------------------------------------------
# recipes.analyze end to end


FAST = [
    "model.max_seq_len=32",
    "train.batch_size=4",
    "train.eval_every=3",
    "train.eval_batches=1",
    "train.sample_tokens=0",
    "train.progress=false",
    "train.steps=3",
    "data.val_fraction=0.1",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("analyze")
    text = "\n\n".join(f"entry {i}: a small corpus for the analysis recipe, row {i % 11}" for i in range(200))
    (d / "c.txt").write_text(text)
    common = [*FAST, f"data.source={d / 'c.txt'}", f"data.cache_dir={d / 'cache'}"]
    assert train_cli(["model.preset=ngpt-tiny", *common, f"train.out_dir={d / 'ngpt'}"]) == 0
    gpt_run = ["model.preset=gpt-tiny", "optim.method=adamw", "optim.warmup_steps=1", f"train.out_dir={d / 'gpt'}"]
    assert train_cli([*gpt_run, *common]) == 0
    return d


def _last_val_loss(run_dir):
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["val_loss"] for r in lines if r.get("val_loss") is not None][-1]


def test_analyze_recipe_end_to_end(runs, capsys):
    out = runs / "report"
    rc = analyze.main([str(runs / "ngpt"), str(runs / "gpt"), "--out", str(out), "--extrapolate",
                       "--eval-batches", "1", "--batch-size", "4"])  # fmt: skip  # options beside their values
    assert rc == 0, capsys.readouterr().err
    for name in ("fig4_embeddings.png", "fig5_condition.png", "fig6_scalings.png", "extrapolation.png"):
        _check_png(out / name)
    stats = json.loads((out / "stats.json").read_text())
    assert list(stats) == ["NGPT ngpt", "GPT gpt"]
    ngpt, gpt = stats["NGPT ngpt"], stats["GPT gpt"]
    assert ngpt["step"] == 3 and ngpt["model"] == "NGPT" and gpt["model"] == "GPT"
    assert ngpt["embeddings"]["input"]["norm_mean"] == pytest.approx(1.0, abs=1e-5)
    assert abs(gpt["embeddings"]["input"]["norm_mean"] - 1.0) > 0.5
    assert len(ngpt["scalings"]["alpha_A_mean_abs"]) == L and "rmsnorm_gains" in gpt
    for s, run in ((ngpt, "ngpt"), (gpt, "gpt")):
        ext = s["extrapolation"]
        assert ext["contexts"] == [32, 64, 128] and all(math.isfinite(v) for v in ext["loss"])
        # 1x on the same 4 x 32 validation tokens the training run evaluated last
        assert ext["loss"][0] == pytest.approx(_last_val_loss(runs / run), rel=1e-4)
    table = (out / "summary.md").read_text()
    assert sum(line.startswith("| ") for line in table.splitlines()) == 3 and "val loss 4x" in table  # header + 2 runs


def test_analyze_without_extrapolation_and_labels(runs):
    out = runs / "report2"
    step_dir = sorted((runs / "ngpt" / "checkpoints").glob("step_*"))[-1]
    assert analyze.main([str(step_dir), "--out", str(out), "--labels", "mine"]) == 0
    assert (out / "fig5_condition.png").is_file() and not (out / "extrapolation.png").exists()
    assert list(json.loads((out / "stats.json").read_text())) == ["mine"]


@pytest.mark.parametrize(
    "extra, needle",
    [
        ([], "no run directory, checkpoint or exported model"),
        (["--factors", "0"], "--factors"),
    ],
)
def test_analyze_errors_exit_2(tmp_path, capsys, extra, needle):
    assert analyze.main([str(tmp_path / "missing"), "--out", str(tmp_path / "o"), *extra]) == 2
    assert needle in capsys.readouterr().err


def test_analyze_too_little_validation_data_exits_2(runs, capsys):
    rc = analyze.main([str(runs / "ngpt"), "--out", str(runs / "r3"), "--extrapolate", "--factors", "1", "1000"])
    assert rc == 2
    assert "needs at least" in capsys.readouterr().err
