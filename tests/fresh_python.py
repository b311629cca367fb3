"""A script run in a fresh Python interpreter, as a user runs one (importable from any test, as
``from fresh_python import run_script``): from a working directory outside the repository, offline
(``HF_HUB_OFFLINE=1``, an empty Hugging Face home), with this checkout's spherenet importable or
with spherenet not importable at all, as where it is not installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Put first in a script that runs where spherenet is not installed: importing spherenet (or any of
# its modules) then fails as it fails there, with ModuleNotFoundError.
WITHOUT_SPHERENET = """
import importlib.abc, sys

class NoSpherenet(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "spherenet":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoSpherenet())
"""


def run_script(script: str, args, workdir: Path, spherenet: bool, timeout: float = 300) -> dict:
    """Run ``script`` with ``args`` (passed as one JSON argument, ``sys.argv[1]``) in ``workdir``;
    it prints its result as ``RESULT <json>``, which is returned. ``spherenet=False``: the
    interpreter is isolated (``-I``: no PYTHONPATH, no script directory) and spherenet is blocked;
    ``True``: this checkout's spherenet is first on the path. stdin is closed, so transformers'
    question whether to run an export's code is answered "no"."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_HOME": str(workdir / "hf_home"), "OMP_NUM_THREADS": "1"}
    env["HF_MODULES_CACHE"] = str(workdir / "hf_modules")
    if spherenet:
        command, env["PYTHONPATH"] = [sys.executable, "-c", script], str(ROOT)
    else:
        command = [sys.executable, "-I", "-c", WITHOUT_SPHERENET + script]
    done = subprocess.run(
        [*command, json.dumps(args)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        cwd=workdir,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.rpartition("RESULT ")[2])
