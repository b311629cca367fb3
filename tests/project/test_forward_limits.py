"""The model read as the paper: one training forward of nGPT runs code in at most 6 files of
spherenet and 1,600 lines (the model file, the stack and attention, the sphere layers, the ops),
traced by ``benchmarks/forward_path.py``. SLERP's update adds its own file (its backward pass is
written out) and is not held to it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "forward_path.py"
MAX_FILES, MAX_LINES = 6, 1600


@pytest.fixture(scope="module")
def forward_path():
    spec = importlib.util.spec_from_file_location("forward_path_for_limits", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("update", ["lerp", "riemannian"])
def test_one_forward_opens_at_most_six_files_and_1600_lines(forward_path, update, one_thread):
    path = forward_path.forward_path("ngpt-tiny", update)
    files, lines = sorted(path["files"]), sum(path["lines"].values())
    listed = ", ".join(f"{name} ({path['lines'][name]})" for name in files)
    assert len(files) <= MAX_FILES and lines <= MAX_LINES, (
        f"a training forward of ngpt-tiny ({update}) runs code in {len(files)} files, {lines} lines "
        f"(at most {MAX_FILES} and {MAX_LINES}): {listed}"
    )


def test_the_update_rule_is_looked_up_when_a_block_is_built_not_per_call(forward_path, one_thread):
    path = forward_path.forward_path("ngpt-tiny", "riemannian")
    assert ("kernels/layer_ops.py", "update_op") not in path["functions"]


def test_each_config_is_defined_in_its_model_file():
    from spherenet.models import GPTConfig, NGPTConfig, gpt, ngpt

    assert NGPTConfig.__module__ == ngpt.__name__ and GPTConfig.__module__ == gpt.__name__
    source = Path(ngpt.__file__).read_text(encoding="utf-8")
    assert source.index("class NGPTConfig") < source.index("class NGPTAttention"), "the config opens the file"
