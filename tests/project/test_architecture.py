"""The shape of the library (docs/architecture.md): which package may import which, file sizes,
reasons beside ``fmt: skip``, and deprecated module names that still work."""

import ast
import importlib
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "spherenet"

# package of spherenet -> the other spherenet packages it may import (docs/architecture.md).
# The root package (spherenet/__init__.py: __version__, the torch version check) may be imported
# by all and imports none. A new package must be placed here before its modules pass.
MAY_IMPORT: dict[str, set[str]] = {
    "manifolds": set(),
    "kernels": {"manifolds"},
    "layers": {"manifolds", "kernels"},
    "optim": {"manifolds", "kernels"},
    # saved models' files (Hugging Face and Normalized-Nemotron layouts): no model class, only configs,
    # state dicts and the sphere registry; checkpoint for the file manifest
    "io": {"manifolds", "layers", "checkpoint"},
    "models": {"manifolds", "kernels", "layers", "optim", "io"},
    "analysis": {"manifolds", "kernels", "layers", "optim", "models"},
    "data": set(),
    "checkpoint": set(),
    "train": {"manifolds", "kernels", "layers", "optim", "io", "models", "data", "checkpoint"},
    "hf": {"manifolds", "kernels", "layers", "optim", "io", "models"},
    "__main__": {"manifolds", "kernels", "layers", "optim", "io", "models", "analysis", "data", "checkpoint", "train"},
}
APPLICATIONS = ("recipes", "benchmarks", "tests")  # they import the library, never the reverse

MAX_LINES = 400  # spherenet/ and recipes/
MAX_LINES_BENCHMARKS = 500  # the studies' scripts
# file -> why it may be longer than MAX_LINES (none at present)
LONG_FILES: dict[str, str] = {}


def library_modules() -> list[tuple[str, Path]]:
    """``(dotted module name, path)`` of every module in spherenet/."""
    found = []
    for path in sorted(LIBRARY.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return found


def imported_names(module: str, path: Path) -> list[tuple[str, int]]:
    """Absolute names of everything ``path`` imports (function-level imports included), with
    their line; ``from pkg import name`` gives ``pkg.name`` so that a submodule counts."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            names += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
    return names


def spherenet_package(name: str) -> str | None:
    """The spherenet package ``name`` lies in (``"optim"`` for ``spherenet.optim.groups``);
    ``None`` for the root package and its attributes, and for names outside spherenet."""
    parts = name.split(".")
    if parts[0] != "spherenet" or len(parts) < 2:
        return None
    return parts[1] if (LIBRARY / parts[1]).is_dir() or parts[1] == "__main__" else None


def test_library_imports_follow_the_layers():
    problems = []
    for module, path in library_modules():
        own = spherenet_package(module)
        for name, line in imported_names(module, path):
            where = f"{path.relative_to(ROOT)}:{line} imports {name}"
            if name.split(".")[0] in APPLICATIONS:
                problems.append(f"{where}: the library never imports {name.split('.')[0]}/")
                continue
            target = spherenet_package(name)
            if target is None or target == own:
                continue
            if own is None:
                problems.append(f"{where}: the root package imports no spherenet package")
            elif own not in MAY_IMPORT:
                problems.append(f"{where}: package {own!r} has no place in MAY_IMPORT (docs/architecture.md)")
            elif target not in MAY_IMPORT[own]:
                allowed = ", ".join(sorted(MAY_IMPORT[own])) or "no other spherenet package"
                problems.append(f"{where}: {own} may import {allowed}, not {target}")
    assert not problems, "imports against the layers of docs/architecture.md:\n" + "\n".join(problems)


def test_import_check_names_the_offending_module_and_import(tmp_path, monkeypatch):
    """The checker itself: a lower layer importing a higher one is reported with file and import."""
    fake = tmp_path / "spherenet"
    (fake / "manifolds").mkdir(parents=True)
    (fake / "models").mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "models" / "__init__.py").write_text("")
    (fake / "manifolds" / "__init__.py").write_text("")
    (fake / "manifolds" / "sphere.py").write_text("def f():\n    from ..models import NGPT\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "LIBRARY", fake)
    with pytest.raises(AssertionError, match=r"spherenet/manifolds/sphere\.py:2 imports spherenet\.models\.NGPT"):
        test_library_imports_follow_the_layers()


def module_import_cycles() -> list[list[str]]:
    """Cycles among spherenet's modules, package ``__init__`` s left out (importing a submodule
    always runs its package's ``__init__`` first, so those edges say nothing about order)."""
    modules = {name: path for name, path in library_modules() if path.name != "__init__.py"}

    def module_of(name: str) -> str | None:  # the longest prefix of an imported name that is a module
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {
        name: {m for n, _ in imported_names(name, path) if (m := module_of(n)) and m != name}
        for name, path in modules.items()
    }
    cycles, done = [], set()

    def visit(name: str, stack: list[str]) -> None:
        if name in stack:
            cycles.append(stack[stack.index(name) :] + [name])
            return
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, stack + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    return cycles


def test_no_module_imports_one_that_imports_it_back():
    """No import circle between modules (function-level imports included): e.g. the model
    classes register themselves with spherenet.models.hub, which imports no model class, and
    spherenet.io, below the models, imports none either."""
    cycles = module_import_cycles()
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_import_cycle_check_finds_a_function_level_cycle(tmp_path, monkeypatch):
    fake = tmp_path / "spherenet"
    (fake / "models").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "models" / "__init__.py").write_text("")
    (fake / "models" / "hub.py").write_text("def load():\n    from .ngpt import NGPT\n")
    (fake / "models" / "ngpt.py").write_text("from .hub import load\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "LIBRARY", fake)
    assert module_import_cycles() == [["spherenet.models.hub", "spherenet.models.ngpt", "spherenet.models.hub"]]


def test_import_cycle_check_finds_a_kernel_family_and_its_triton_module(tmp_path, monkeypatch):
    """A family that loads its Triton module on first use (a function-level import) and a Triton
    module that imports the family back (module level) for a fallback: a circle, whatever its
    reason (the resolver decides fallbacks, spherenet.kernels.resolve)."""
    fake = tmp_path / "spherenet"
    (fake / "kernels").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "kernels" / "__init__.py").write_text("")
    (fake / "kernels" / "norm.py").write_text("def f(x):\n    from . import norm_triton\n")
    (fake / "kernels" / "norm_triton.py").write_text("from .norm import f\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "LIBRARY", fake)
    assert module_import_cycles() == [
        ["spherenet.kernels.norm", "spherenet.kernels.norm_triton", "spherenet.kernels.norm"]
    ]
    with pytest.raises(AssertionError, match="import cycles: spherenet.kernels.norm -> spherenet.kernels.norm_triton"):
        test_no_module_imports_one_that_imports_it_back()


def private_imports_across_packages() -> list[str]:
    """``path:line imports name`` for every import of a private name or module (a part after
    ``spherenet`` starting with ``_``, dunders aside) from another package than the importer's
    (the root package counts as another): what a package does not export is its own business."""
    found = []
    for module, path in library_modules():
        own = spherenet_package(module)
        for name, line in imported_names(module, path):
            parts = name.split(".")
            if parts[0] != "spherenet" or spherenet_package(name) == own and own is not None:
                continue
            private = [p for p in parts[1:] if p.startswith("_") and not (p.startswith("__") and p.endswith("__"))]
            if private:
                found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return found


def test_no_package_imports_another_packages_private_names():
    found = private_imports_across_packages()
    assert not found, "private names imported across packages (make them public or move them):\n" + "\n".join(found)


def test_private_import_check_finds_names_and_modules_and_spares_the_own_package(tmp_path, monkeypatch):
    fake = tmp_path / "spherenet"
    for package in ("manifolds", "kernels", "optim"):
        (fake / package).mkdir(parents=True)
        (fake / package / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "manifolds" / "geodesic.py").write_text("def _work_dtype(): ...\n")
    (fake / "kernels" / "_choice.py").write_text("def run(): ...\n")
    (fake / "kernels" / "norm.py").write_text(
        "from .. import __version__\nfrom ._choice import run\nfrom ..manifolds.geodesic import _work_dtype\n"
    )
    (fake / "optim" / "adam.py").write_text("def step():\n    from ..kernels._choice import run\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "LIBRARY", fake)
    assert private_imports_across_packages() == [
        "spherenet/kernels/norm.py:3 imports spherenet.manifolds.geodesic._work_dtype",
        "spherenet/optim/adam.py:2 imports spherenet.kernels._choice.run",
    ]
    with pytest.raises(AssertionError, match="private names imported across packages"):
        test_no_package_imports_another_packages_private_names()


# application -> the other applications it may import (besides spherenet's public names): the
# benchmarks run the recipes' code, the recipes (installed with the library) import neither.
APPLICATION_MAY_IMPORT: dict[str, set[str]] = {"recipes": set(), "benchmarks": {"recipes"}}


def application_import_problems() -> list[str]:
    """``path:line imports name: why`` for every import in recipes/ and benchmarks/ of a private
    spherenet name or module (a part after ``spherenet`` starting with ``_``, dunders aside), or of
    an application that APPLICATION_MAY_IMPORT does not allow: they use the library's public names."""
    found = []
    for top in sorted(APPLICATION_MAY_IMPORT):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            for name, line in imported_names(module, path):
                first, *rest = name.split(".")
                where = f"{path.relative_to(ROOT).as_posix()}:{line} imports {name}"
                if first in APPLICATIONS and first != top and first not in APPLICATION_MAY_IMPORT[top]:
                    found.append(f"{where}: {top}/ does not import {first}/")
                elif first == "spherenet":
                    if [p for p in rest if p.startswith("_") and not (p.startswith("__") and p.endswith("__"))]:
                        found.append(f"{where}: a private name of spherenet (make it public where it belongs)")
    return found


def test_recipes_and_benchmarks_import_only_public_names_of_the_library():
    found = application_import_problems()
    assert not found, "imports against the layers of docs/architecture.md:\n" + "\n".join(found)


def test_application_import_check_finds_private_names_and_modules_and_other_applications(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "recipes" / "__init__.py").write_text("")
    (tmp_path / "recipes" / "train.py").write_text(
        "from spherenet import __version__\nfrom spherenet.data import prepare_dataset\n"
        "def f():\n    from spherenet.data._files import file_sha256\n    import benchmarks.bench_step\n"
    )
    (tmp_path / "benchmarks" / "bench.py").write_text(
        "from recipes.train import f\nfrom spherenet.kernels import _triton\nfrom _machine import host\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert application_import_problems() == [
        "benchmarks/bench.py:2 imports spherenet.kernels._triton: a private name of spherenet (make it public where"
        " it belongs)",
        "recipes/train.py:4 imports spherenet.data._files.file_sha256: a private name of spherenet (make it public"
        " where it belongs)",
        "recipes/train.py:5 imports benchmarks.bench_step: recipes/ does not import benchmarks/",
    ]
    with pytest.raises(AssertionError, match="imports against the layers"):
        test_recipes_and_benchmarks_import_only_public_names_of_the_library()


@pytest.mark.parametrize("module", ["spherenet.models.hub", "spherenet.models.ngpt", "spherenet.models.gpt"])
def test_each_model_module_imports_alone_and_the_registry_is_full(module):
    """In a fresh interpreter, importing one model module first works, and every model class is
    registered by then (the package's __init__ imports them)."""
    code = f"import {module}; from spherenet.models import MODEL_CLASSES; print(sorted(MODEL_CLASSES))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["['gpt',", "'ngpt']"]


def test_io_imports_no_model_module():
    """spherenet.io lies below the models: importing it in a fresh interpreter loads no module of
    spherenet.models (the models' base class calls into it, never the reverse)."""
    code = "import sys, spherenet.io; print(sorted(m for m in sys.modules if m.startswith('spherenet.models')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_library_files_stay_short():
    """The library and the recipes at most MAX_LINES, the benchmarks' scripts MAX_LINES_BENCHMARKS."""
    long = {}
    for top, limit in (("spherenet", MAX_LINES), ("recipes", MAX_LINES), ("benchmarks", MAX_LINES_BENCHMARKS)):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > limit and rel not in LONG_FILES:
                long[rel] = f"{lines} lines (limit {limit})"
    assert not long, f"files too long (split them by idea): {long}"


MAX_TEST_LINES = 600  # a test file; a longer one is split by topic
# Test files still longer than MAX_TEST_LINES, to be split when nobody else is editing them. The
# set only shrinks: a listed file that has become short enough (or is gone) fails the test too.
LONG_TEST_FILES: set[str] = set()


def long_test_files(known_long: set[str]) -> tuple[dict[str, int], list[str]]:
    """The test files over MAX_TEST_LINES that ``known_long`` does not list (with their lengths),
    and the listed ones that are no longer over it."""
    lengths = {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted((ROOT / "tests").rglob("*.py"))
    }
    long = {rel: n for rel, n in lengths.items() if n > MAX_TEST_LINES and rel not in known_long}
    stale = sorted(rel for rel in known_long if lengths.get(rel, 0) <= MAX_TEST_LINES)
    return long, stale


def test_test_files_stay_short():
    long, stale = long_test_files(LONG_TEST_FILES)
    assert not long, f"test files over {MAX_TEST_LINES} lines (split them by topic): {long}"
    assert not stale, f"no longer over {MAX_TEST_LINES} lines: take them off LONG_TEST_FILES: {stale}"


def test_long_test_file_check_names_new_long_files_and_stale_exceptions(tmp_path, monkeypatch):
    (tmp_path / "tests" / "a").mkdir(parents=True)
    (tmp_path / "tests" / "a" / "test_long.py").write_text("x = 1\n" * (MAX_TEST_LINES + 1))
    (tmp_path / "tests" / "a" / "test_split.py").write_text("x = 1\n" * MAX_TEST_LINES)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    known = {"tests/a/test_split.py", "tests/a/test_gone.py"}
    assert long_test_files(known) == (
        {"tests/a/test_long.py": MAX_TEST_LINES + 1},
        ["tests/a/test_gone.py", "tests/a/test_split.py"],
    )
    assert long_test_files({"tests/a/test_long.py"}) == ({}, [])


# `# fmt: skip` followed by a comment: ruff still honours it (text right after `skip` it does not).
_FMT_SKIP = re.compile(r"#\s*fmt:\s*skip\b(?P<after>.*)$")


def bare_fmt_skips(paths) -> list[str]:
    """``path:line`` of every ``# fmt: skip`` comment with no reason: neither a comment after it
    (``# fmt: skip  # one case per line``) or before it on the line, nor a comment line just above."""
    bare = []
    for path in paths:
        lines = path.read_text(encoding="utf-8").splitlines()
        with open(path, "rb") as f:
            comments = [t for t in tokenize.tokenize(f.readline) if t.type == tokenize.COMMENT]
        for token in comments:
            found = _FMT_SKIP.search(token.string)
            if found is None:
                continue
            row = token.start[0]
            reason_after = found.group("after").strip().lstrip("#").strip()
            reason_before = token.string[: found.start()].strip().lstrip("#").strip()
            above = lines[row - 2].strip() if row > 1 else ""
            reason_above = above.startswith("#") and "fmt:" not in above
            if not (reason_after or reason_before or reason_above):
                bare.append(f"{path.relative_to(ROOT).as_posix()}:{row}")
    return bare


def repository_python_files() -> list[Path]:
    return sorted(p for d in ("spherenet", "tests", "recipes", "benchmarks") for p in (ROOT / d).rglob("*.py"))


def test_every_fmt_skip_has_a_reason():
    bare = bare_fmt_skips(repository_python_files())
    assert not bare, "give each `# fmt: skip` a reason (`# fmt: skip  # why`) or let ruff format it:\n" + "\n".join(
        bare
    )


def test_bare_fmt_skip_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    src = tmp_path / "m.py"
    src.write_text(
        "a = [1,  2]  # fmt: skip\n"
        "b = [1,  2]  # fmt: skip  # one case per line\n"
        "c = [1,  2]  # aligned with d  # fmt: skip\n"
        "# aligned with the line below\n"
        "d = [1,  2]  # fmt: skip\n"
        "e = [1,  2]  # fmt: skip  #\n"
    )
    assert bare_fmt_skips([src]) == ["m.py:1", "m.py:6"]


def test_renamed_modules_are_gone_not_shimmed():
    """No compatibility layer: a renamed module is renamed everywhere at once (CHANGELOG.md)."""
    for old in ("spherenet.optim.radam", "spherenet.optim.recipes"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)


def test_nothing_in_the_library_or_recipes_warns_about_deprecation():
    hits = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in repository_python_files()
        if path.parts[len(ROOT.parts)] in ("spherenet", "recipes")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "DeprecationWarning" in line and "torch.jit.script" not in line
    ]
    assert not hits, hits


# every public name the rest of the repository imports from a package that was split into modules
SPLIT_PACKAGES = {
    "spherenet.checkpoint": [
        "CheckpointManager",
        "LoadedCheckpoint",
        "VerifiedCheckpoint",
        "CheckpointError",
        "CheckpointCorruptError",
        "CheckpointMismatchError",
        "NonFiniteStateError",
        "CheckpointWarning",
        "model_fingerprint",
        "FORMAT_VERSION",
        "MANIFEST",
        "STATE_FILE",
        "SHARDED_DIR",
    ],
    "spherenet.analysis": [
        "condition_number",
        "embedding_stats",
        "condition_numbers",
        "scaling_factors",
        "with_max_seq_len",
        "length_extrapolation",
        "plot_embeddings",
        "plot_condition_numbers",
        "plot_scalings",
        "plot_extrapolation",
        "CONDITION_KEYS",
    ],
    "spherenet.data.tokenizer": [
        "SPEC_FILE",
        "ByteTokenizer",
        "HFTokenizer",
        "Tokenizer",
        "build_tokenizer",
        "load_pretrained",
        "load_tokenizer",
        "train_bpe",
    ],
    "spherenet.data.prepare": [
        "FORMAT_VERSION",
        "META_FILE",
        "PreparedData",
        "default_corpus",
        "load_prepared",
        "prepare_dataset",
        "token_dtype",
    ],
}


@pytest.mark.parametrize("package", sorted(SPLIT_PACKAGES))
def test_split_packages_keep_their_public_names(package):
    module = importlib.import_module(package)
    missing = [name for name in SPLIT_PACKAGES[package] if not hasattr(module, name)]
    assert not missing, f"{package} no longer provides {missing}"
    assert set(SPLIT_PACKAGES[package]) <= set(module.__all__), f"{package}.__all__ lost some of its names"
