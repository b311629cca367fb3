"""The trace of one training forward (``benchmarks/forward_path.py``): the files it opens, their
lines, the calls and the moves between files, counted from the calls it really makes."""

from __future__ import annotations


def test_the_trace_counts_the_files_and_calls_of_one_forward(forward_path, one_thread):
    path = forward_path.forward_path("ngpt-tiny")
    files = path["files"]
    assert {"models/ngpt.py", "models/common.py", "layers/attention.py"} <= set(files)
    assert not any(name.startswith(("optim/", "data/", "checkpoint/")) for name in files)
    blocks = 2  # ngpt-tiny's layers: each block's forward is one call of models/ngpt.py's NGPTBlock.forward
    assert path["functions"]["models/ngpt.py", "forward"] == 2 * blocks  # each block and its MLP
    assert sum(files.values()) == sum(path["functions"].values())
    assert 0 < path["switches"] < sum(files.values())
    assert path["lines"]["models/ngpt.py"] == len((forward_path.ROOT / "models" / "ngpt.py").read_text().splitlines())


def test_the_script_prints_the_table_and_the_totals(forward_path, capsys, one_thread):
    assert forward_path.main(["--model", "gpt-tiny", "--calls", "3"]) == 0
    out = capsys.readouterr().out
    assert "| `models/gpt.py` |" in out and "switches between files" in out
