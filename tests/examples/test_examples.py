"""The scripts in examples/ run as a reader runs them, and the documentation shows them as they
are: every guide that shows an example includes the file itself (``--8<--``), and the README's
quick start is examples/quickstart.py word for word."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
INCLUDE = re.compile(r'^\s*--8<--\s+"([^"]+)"', re.M)

# what each example prints when it has done its work (besides exiting 0)
PRINTS = {
    "quickstart": r"largest \|row norm - 1\| after the step: \d\.\de-0[5-9]",
    "own_model": r"largest \|row norm - 1\| over the sphere weights: \d\.\de-0[5-9]",
    "update_rules": r"\| lerp \|.*\n\| slerp \|.*\n\| riemannian \|",
    "sphere_weights": r"\| RiemannianAdam \| 0\.9\d\d \|",
    "hf_trainer": r"largest \|row norm - 1\| of the loaded model: \d\.\de-0[5-9]",
    "encoder_classifier": r"accuracy (0\.9\d\d|1\.000)",
    "seq2seq": r"greedy decoding with KV caches: (0\.9\d\d|1\.000) of tokens",
    "own_geometry": r"sum of the weight",
}


def test_every_example_has_an_expected_output():
    assert sorted(PRINTS) == sorted(p.stem for p in EXAMPLES)


def test_every_example_is_included_by_a_documentation_page():
    included = set()
    for page in (ROOT / "docs").rglob("*.md"):
        included.update(INCLUDE.findall(page.read_text()))
    assert not included - {str(p.relative_to(ROOT)) for p in EXAMPLES} - _other_snippets(included)
    shown = {Path(i).stem for i in included if i.startswith("examples/")}
    assert shown == {p.stem for p in EXAMPLES}, f"not shown in docs/: {sorted({p.stem for p in EXAMPLES} - shown)}"


def _other_snippets(included: set[str]) -> set[str]:
    """Included files that are not examples must exist."""
    others = {i for i in included if not i.startswith("examples/")}
    assert all((ROOT / i).is_file() for i in others), others
    return others


def test_the_readme_quick_start_is_the_example_word_for_word():
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```python\n(.*?)```", readme, flags=re.S)
    assert first, "README.md has no Python example"
    assert first.group(1) == (ROOT / "examples" / "quickstart.py").read_text()
    assert readme[: first.start()].count("\n") < 80, "the quick start must begin within the README's first 80 lines"


@pytest.mark.slow  # a fresh interpreter per example; 10-60 s each on a shared 2-core machine
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_as_a_script(path, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.setdefault("OMP_NUM_THREADS", "1")
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(PRINTS[path.stem], done.stdout), done.stdout[-3000:]
    assert not list(tmp_path.iterdir()), "an example left files in the working directory"
    print(f"{path.name}: {seconds:.1f} s")
