"""The benchmark scripts' CPU smoke runs (--quick) write the markdown tables of BENCHMARKS.md,
and benchmarks/gpu.sh stops at once, with a clear message, where there is no CUDA device."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
NUMBER = r"-?\d[\d,]*(\.\d+)?"
TIMING = rf"{NUMBER} \({NUMBER}–{NUMBER}\)"  # median (min–max)


def bench_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["SPHERENET_KERNELS"] = "torch"  # no native build in a smoke run (the optimizer bench skips it)
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_bench(script: str, out: Path, *args: str) -> str:
    """Run ``benchmarks/SCRIPT --quick --markdown OUT``; return what it wrote to OUT."""
    cmd = [sys.executable, str(REPO / "benchmarks" / script), "--quick", "--markdown", str(out), *args]
    done = subprocess.run(cmd, cwd=REPO, env=bench_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    assert text.strip() in done.stdout  # printed too
    return text


def table(text: str, header: str) -> list[list[str]]:
    """The cells of the rows of the markdown table whose header line is ``header``."""
    lines = text.splitlines()
    assert header in lines, f"no table with header {header!r} in:\n{text}"
    start = lines.index(header)
    assert re.fullmatch(r"\|(---\|)+", lines[start + 1])
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    assert rows, f"table {header!r} has no rows"
    return rows


def check_preamble(text: str, title: str) -> None:
    assert text.startswith(f"### {title}")
    assert f"torch {torch.__version__}" in text
    assert re.search(r"\n\d{4}-\d\d-\d\d; ", text)


@pytest.mark.slow
def test_bench_step_quick_markdown(tmp_path):
    text = run_bench("bench_step.py", tmp_path / "step.md", "--variants")
    check_preamble(text, "Training step time, nGPT vs GPT: cpu fp32, context 64, batch 4")
    rows = table(
        text, "| mode | nGPT ms/step | GPT ms/step | nGPT/GPT (medians) | nGPT/GPT (median of per-round ratios) |"
    )
    assert [r[0] for r in rows] == [
        "eager",
        "eager, plain autograd",
        "eager, activation checkpointing",
        "eager, Triton kernels",  # under Triton's interpreter (tests/conftest.py): a path check, not a time
        "eager, SLERP update",
        "eager, Riemannian update",
        "eager, tangent-projected optimizer",
    ]
    for mode, n, g, ratio, paired in rows:
        assert re.fullmatch(TIMING, n) and re.fullmatch(TIMING, g), (n, g)
        assert re.fullmatch(NUMBER, ratio) and re.fullmatch(NUMBER, paired)
    header = (
        "| model | eager tokens/s | eager, plain autograd tokens/s | eager, activation checkpointing tokens/s "
        "| eager, Triton kernels tokens/s | eager, SLERP update tokens/s | eager, Riemannian update tokens/s "
        "| eager, tangent-projected optimizer tokens/s |"
    )
    rows = table(text, header)
    assert [r[0] for r in rows] == ["nGPT", "GPT"]
    assert rows[1][2] == "-" and rows[1][4:] == ["-"] * 4  # nGPT-only variants
    assert "Triton's interpreter on CPU" in text
    assert all(re.fullmatch(NUMBER, c) for r in rows for c in r[1:] if c != "-")


def test_bench_step_update_and_optimizer_variants_change_only_ngpt():
    """``--variants slerp riemannian tangent`` train the budget study's arms: nGPT with that
    update, or its optimizer on the tangent-projected gradient; GPT and eager nGPT unchanged."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import bench_step

    args = bench_step.parse_args(["--quick"])
    cpu = torch.device("cpu")

    def built(family, mode):
        model, optimizer, _ = bench_step.build(family, args, cpu, mode)
        parts = getattr(optimizer, "optimizers", [optimizer])
        gradients = {part.options.gradient for part in parts if hasattr(part, "options")}
        return model.config, gradients

    eager_config, eager_gradients = built("nGPT", "eager")
    assert eager_config.update == "lerp" and eager_gradients == {"euclidean"}
    for mode, update, gradients in (
        ("slerp", "slerp", {"euclidean"}),
        ("riemannian", "riemannian", {"euclidean"}),
        ("tangent", "lerp", {"riemannian"}),
    ):
        config, got = built("nGPT", mode)
        assert (config.update, got) == (update, gradients), mode
        assert dataclasses.replace(config, update="lerp") == eager_config  # nothing else changed
    assert [m for m in bench_step.NGPT_ONLY if m in ("slerp", "riemannian", "tangent")] == [
        "slerp",
        "riemannian",
        "tangent",
    ]
    assert bench_step.baseline_of("slerp") == bench_step.baseline_of("tangent") == ("GPT", "eager")


@pytest.mark.slow
def test_bench_memory_quick_markdown(tmp_path):
    text = run_bench("bench_memory.py", tmp_path / "memory.md")
    check_preamble(text, "Peak memory of a training step, nGPT vs GPT: cpu fp32, context 64, batch 4")
    header = "| model | mode | params MiB | optim state MiB | step peak MiB | total MiB | saved for backward MiB | VmHWM MiB |"
    rows = table(text, header)
    assert [r[:2] for r in rows] == [["nGPT", "eager"], ["GPT", "eager"]]
    for row in rows:
        assert all(re.fullmatch(NUMBER, cell) for cell in row[2:]), row
        params, state, peak, total, saved = map(float, row[2:7])
        assert params > 0 and state > 0 and saved > 0 and peak >= saved
        assert total == pytest.approx(params + state + peak, abs=0.15)
    rows = table(
        text, "| mode | nGPT / GPT step peak | nGPT / GPT total | nGPT / GPT saved for backward | nGPT / GPT VmHWM |"
    )
    assert rows[0][0] == "eager" and all(re.fullmatch(NUMBER, cell) for cell in rows[0][1:])


@pytest.mark.slow
def test_bench_optimizer_quick_markdown(tmp_path):
    text = run_bench("bench_optimizer.py", tmp_path / "optimizer.md")
    check_preamble(text, "Optimizer step: cpu fp32, 1 thread")
    assert "native kernel not run: disabled by SPHERENET_KERNELS=torch" in text
    rows = table(
        text,
        "| contender | cpu fp32, 1 thread: ms | x fused Adam | x fused Adam, per round: median (quartiles) "
        "| geoopt / this |",
    )
    names = [r[0] for r in rows]
    assert names[0] == "torch Adam fused" and "geoopt RiemannianAdam" in names
    for moment in ("element", "row"):  # every row names the gradient it timed
        for gradient in ("euclidean", "riemannian"):
            assert f"spherenet RiemannianAdam, {moment}, {gradient} gradient, torch" in names
    assert "spherenet RiemannianAdam, element, euclidean gradient, torch, wave_bytes unlimited" in names
    assert not any("native" in name or "triton" in name for name in names)  # Triton: CUDA only
    for name, ms, vs_adam, per_round, vs_geoopt in rows:
        assert re.fullmatch(TIMING, ms) and re.fullmatch(NUMBER, vs_adam) and re.fullmatch(NUMBER, vs_geoopt), name
        median, q1, q3 = map(float, re.fullmatch(r"(\S+) \((\S+)–(\S+)\)", per_round).groups())
        assert 0 < q1 <= median <= q3, name
    assert rows[0][2] == "1.00" and rows[0][3] == "1.00 (1.00–1.00)"


@pytest.mark.slow
def test_benches_refuse_cuda_without_a_device(tmp_path):
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_optimizer.py"), "--quick", "--device", "cuda"]
    done = subprocess.run(cmd, cwd=REPO, env=bench_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "--device cuda: no CUDA device" in done.stderr


@pytest.mark.slow
def test_gpu_script_fails_fast_without_cuda(tmp_path):
    out = tmp_path / "gpu.md"
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu.sh"), str(out)],
        env=bench_env(),  # CUDA_VISIBLE_DEVICES="" hides any GPU
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "benchmarks/gpu.sh: no CUDA device" in done.stderr
    assert "torch.cuda.is_available() = False" in done.stderr
    assert not out.exists()  # nothing ran
