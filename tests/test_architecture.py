"""The shape of the library: deprecated module names still work (and say so)."""

import importlib
import sys

import pytest

# old module -> (new module, names it must give back)
RENAMED_MODULES = {
    "spherenet.optim.radam": (
        "spherenet.optim.riemannian_adam",
        ["RiemannianAdam", "SECOND_MOMENTS", "GRADIENTS", "SPHERE_KERNELS", "resolve_sphere_kernel", "split_fused"],
    ),
}


@pytest.mark.parametrize("old", sorted(RENAMED_MODULES))
def test_renamed_module_warns_and_gives_the_same_objects(old, monkeypatch):
    new, names = RENAMED_MODULES[old]
    monkeypatch.delitem(sys.modules, old, raising=False)  # the warning fires on first import only
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        shim = importlib.import_module(old)
    target = importlib.import_module(new)
    for name in names:
        assert getattr(shim, name) is getattr(target, name), f"{old}.{name} is not {new}.{name}"
