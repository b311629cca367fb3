"""Test-suite settings shared by every test module.

Helpers the tests import from this directory (it is on ``sys.path``): ``tiny_models`` (tiny nGPT
and GPT configs and models: ``tiny_config``, ``tiny_model``, ``tiny_ngpt``, ``tiny_gpt``,
``layer_config``), ``model_references`` (unit rows, RoPE as a matrix, scalings moved off their
init), ``corpora`` (text files to train on), ``signals``, ``gloo``, ``fresh_python``.
"""

import os

import pytest
import torch
from hypothesis import settings

# Locally hypothesis explores new examples on each run; in CI (CI=true) the examples are
# derandomized so that a run is reproducible and a failure can be replayed exactly.
settings.register_profile("spherenet", max_examples=60, deadline=None)
settings.register_profile("ci", parent=settings.get_profile("spherenet"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "spherenet")

# Under pytest-xdist ("-n auto": one worker per core) each worker, and every process a test
# starts, gets one intra-op thread: with torch's default of one thread per core in every worker,
# the cores are oversubscribed and small-tensor kernels run many times slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Without a GPU the Triton kernels run on CPU tensors under Triton's interpreter, which must be
# chosen before Triton is first imported (tests/kernels/test_triton_ops.py).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def one_thread():
    """One intra-op thread for a test of tiny tensors: fastest, and it keeps the tests quick when
    the CPU is shared (an oversubscribed OpenMP pool can make each kernel 100x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _saved_bytes(model: torch.nn.Module, forward_backward) -> int:
    """Bytes of the distinct storages that ``forward_backward()`` keeps for the backward pass,
    the model's parameters excluded: its activation memory."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward_backward()
    return sum(saved.values())


@pytest.fixture
def saved_bytes():
    """``saved_bytes(model, forward_backward)``: the activation bytes a forward and backward keep."""
    return _saved_bytes
