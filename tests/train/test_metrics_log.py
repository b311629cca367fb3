"""spherenet.train.metrics.MetricsLog: one JSON record a line, read back whole, and read beside a
live writer without tripping over a line caught mid-append."""

from __future__ import annotations

import pytest

from spherenet.train.metrics import MetricsLog


def test_records_read_back_and_a_line_caught_mid_append_is_left_out(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert MetricsLog.read_complete(path) == []  # no file yet
    log = MetricsLog(path)
    log.log(step=1, loss=2.5)
    log.log(step=2, loss=float("nan"))  # not finite: null
    records = MetricsLog.read(path)
    assert [(r["step"], r["loss"]) for r in records] == [(1, 2.5), (2, None)]
    with path.open("a") as f:
        f.write('{"step": 3, "lo')  # what a reader sees while the writer is mid-line
    assert MetricsLog.read_complete(path) == records
    with pytest.raises(ValueError):
        MetricsLog.read(path)  # the strict reader says the file is not whole
