"""What the project says about itself is true: the configs, files, scripts, tests and commands
that README.md, BENCHMARKS.md and the documentation site's pages (docs/**/*.md) name exist (and
the configs and overrides load); the torch floor in pyproject.toml is the one the code needs and enforces; and the tracked files
speak of the project only (no work-tracking numbers)."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spherenet.train.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
SNIPPET = re.compile(r'^--8<--\s+"([^"]+)"\s*$', re.M)  # pymdownx.snippets: a file shown in place


def _doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _expand_braces(text: str) -> list[str]:
    """``a-{x,y}-{1,2}.toml`` -> every combination (shell brace expansion, no nesting)."""
    parts = re.split(r"(\{[^{}]*\})", text)
    choices = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
    return ["".join(c) for c in itertools.product(*choices)]


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)


def _commands(text: str) -> list[list[str]]:
    """Shell commands of the fenced code blocks (continuation lines joined, comments dropped)."""
    commands = []
    for block in _code_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                try:
                    commands.append(shlex.split(line))
                except ValueError:  # not a shell line (a Python snippet)
                    continue
    return commands


def _config(name: str) -> Path:
    """A ``--config`` value as the trainer reads it: a path from the repository root, or the name
    of a shipped config (``recipes.config_files.resolve_config``)."""
    path = ROOT / name
    if path.is_file():
        return path
    shipped = ROOT / "recipes" / "configs" / (name if name.endswith(".toml") else f"{name}.toml")
    return shipped if "/" not in name else path


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_named_configs_exist_and_load(doc):
    text = doc.read_text()
    named = {p for m in re.findall(r"recipes/configs/[\w{},.-]+\.toml", text) for p in _expand_braces(m)}
    for cmd in _commands(text):
        named.update(cmd[i + 1] for i, word in enumerate(cmd[:-1]) if word == "--config")
    for path in sorted(named):
        found = _config(path)
        assert found.is_file(), f"{doc.name} names {path}, which does not exist"
        load_config(found)  # a ConfigError names the bad key


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_training_commands_parse(doc):
    """Every ``recipes.train``/``recipes.compare`` command line's config and overrides load."""
    checked = 0
    for cmd in _commands(doc.read_text()):
        if not any(m in cmd for m in ("recipes.train", "recipes.compare")):
            continue
        config = cmd[cmd.index("--config") + 1] if "--config" in cmd else None
        overrides = [w for w in cmd if re.match(r"^[A-Za-z_]\w*\.[A-Za-z_]\w*=", w)]
        load_config(_config(config) if config else None, overrides)
        checked += 1
    if doc.name == "README.md":
        assert checked >= 5  # the scan does see the README's commands


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_named_files_scripts_and_tests_exist(doc):
    text = doc.read_text()
    missing = []
    for label, target in re.findall(r"\[([^\]]*)\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            missing.append(target)
            continue
        test = re.match(r"`?(test_\w+)", label)
        if test and path.suffix == ".py" and f"def {test.group(1)}(" not in path.read_text():
            missing.append(f"{target}::{test.group(1)}")
    for script in re.findall(r"python (benchmarks/[\w/]+\.py)", text):
        if not (ROOT / script).is_file():
            missing.append(script)
    for module in re.findall(r"python -m (recipes\.\w+)", text):
        if not (ROOT / (module.replace(".", "/") + ".py")).is_file():
            missing.append(module)
    assert not missing, f"{doc.name} names what does not exist: {missing}"


# --- the torch floor ------------------------------------------------------------------------------


def _declared_torch_floor() -> tuple[int, ...]:
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'"torch>=([\d.]+)"', text)
    assert match, "pyproject.toml declares no torch>= floor"
    return tuple(int(x) for x in match.group(1).split("."))


@pytest.mark.parametrize("doc", [d for d in DOCS if "```python" in d.read_text()], ids=_doc_id)
def test_python_snippets_name_nothing_they_do_not_define(doc, tmp_path):
    """Each ```python block of the docs, as a reader copies it alone into a file: every name it
    uses is imported or defined in it (ruff's undefined-name check), so that it runs as written."""
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).is_file():
        pytest.skip("ruff is not installed (the dev extra)")
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    blocks = [SNIPPET.sub(lambda m: (ROOT / m.group(1)).read_text(), block) for block in blocks]  # as the site shows it
    for i, block in enumerate(blocks):
        (tmp_path / f"snippet_{i:02d}.py").write_text(block)
    found = subprocess.run(
        [ruff, "check", "--isolated", "--select", "F821", "--output-format", "concise", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert found.returncode == 0, f"{doc.name}: a snippet uses a name it does not define:\n{found.stdout}"


def test_installed_torch_meets_the_declared_floor_and_the_check_agrees():
    import torch

    import spherenet

    installed = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
    floor = _declared_torch_floor()
    assert installed >= floor[:2], f"torch {torch.__version__} is below pyproject's floor {floor}"
    assert spherenet.MIN_TORCH == floor[:2], "spherenet.MIN_TORCH and pyproject.toml disagree"


@pytest.mark.parametrize("version, refused", [("2.6.0+cpu", True), ("2.7.0", False)])  # each ~5 s (imports torch)
def test_import_refuses_an_older_torch(version, refused):
    """spherenet refuses, at import, a torch older than the floor, with a message that names
    both versions (checked in a fresh interpreter whose torch reports ``version``)."""
    code = f"import torch\ntorch.__version__ = {version!r}\nimport spherenet\nprint('imported')\n"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    if refused:
        assert done.returncode != 0
        assert "ImportError" in done.stderr and f"torch {version}" in done.stderr
        assert "spherenet needs torch >= " in done.stderr
    else:
        assert done.returncode == 0, done.stderr[-2000:]
        assert "imported" in done.stdout


# --- the project speaks of itself ------------------------------------------------------------------

TRACKING = r"(issue|session)s? ?#?[0-9]+"


def test_tracked_files_name_no_work_tracking_numbers():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "grep", "-niE", TRACKING], cwd=ROOT, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        pytest.skip(f"git grep failed: {done.stderr.strip()}")
    hits = done.stdout.splitlines()
    assert not hits, "work-tracking references in tracked files:\n" + "\n".join(hits)


def test_ci_runs_the_readme_test_command():
    """The README's second command is the one `.ci/run` calls, word for word."""
    readme_commands = _commands((ROOT / "README.md").read_text())
    test_command = next(cmd for cmd in readme_commands if cmd[:3] == ["python", "-m", "pytest"])
    ci_lines = [shlex.split(line) for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    assert test_command in ci_lines, f"README runs {test_command}; .ci/run has {ci_lines}"


# --- the name it installs under ----------------------------------------------------------------------

WRONG_INSTALL = r"""pip install ["']?spherenet(\[|["' ]|$)"""  # the index's "spherenet" is another project


def test_the_distribution_name_is_declared_once_and_every_install_hint_names_it():
    import spherenet

    declared = re.search(r'^name = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert declared and declared.group(1) == spherenet.DISTRIBUTION, "pyproject.toml and spherenet.DISTRIBUTION"
    assert spherenet.install_hint("hf") == f'pip install "{spherenet.DISTRIBUTION}[hf]"'
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(
        ["git", "grep", "-nE", WRONG_INSTALL, "--", ".", ":!CHANGELOG.md"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode in (0, 1), done.stderr
    hits = [line for line in done.stdout.splitlines() if not line.startswith("tests/project/test_project_truths.py")]
    assert not hits, "install hints naming the package index's unrelated 'spherenet':\n" + "\n".join(hits)


# --- what each extra brings ----------------------------------------------------------------------

# the packages a user of the transformers classes, PEFT, Trainer and lm-evaluation-harness installs
EXTRA_PACKAGES = {"hf": ("transformers", "peft", "accelerate"), "eval": ("lm_eval",)}


def test_the_readme_install_section_names_the_extras_of_transformers_peft_accelerate_and_lm_eval():
    """The README's install section says which extra brings which of these packages, as
    pyproject.toml declares them."""
    from spherenet.train.config_toml import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    sections = (ROOT / "README.md").read_text().split("\n## ")
    install = next((section for section in sections if section.startswith("Install")), None)
    assert install is not None, "the README has no Install section"
    for extra, packages in EXTRA_PACKAGES.items():
        declared = {re.split(r"[<>=\[ ]", requirement)[0] for requirement in extras[extra]}
        assert set(packages) <= declared, f"pyproject.toml's [{extra}] is {extras[extra]}"
        line = next((line for line in install.splitlines() if f"[{extra}]" in line), None)
        assert line is not None, f"the README's install section does not name the [{extra}] extra"
        named = {package: package.replace("_", "-") for package in packages}
        assert all(re.search(rf"{alias}|{package}", line, re.I) for package, alias in named.items()), line
