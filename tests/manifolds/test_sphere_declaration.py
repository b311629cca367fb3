"""One declaration of a sphere weight (declare_sphere) and one reader (sphere_dim, declared_spheres)."""

from __future__ import annotations

import pytest
from torch import nn

import spherenet.layers
import spherenet.optim
from spherenet.manifolds import (
    SPHERE,
    UNIT_SPHERE,
    declare_manifold,
    declare_sphere,
    declared_spheres,
    named_sphere_parameters,
    sphere_dim,
)
from spherenet.manifolds.sphere import geoopt
from spherenet.models import from_preset
from spherenet.optim import normalize_, param_groups


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 6, bias=False)
        self.b = nn.Linear(4, 6, bias=False)
        self.b.weight = self.a.weight  # one parameter, two owners
        declare_sphere(self.a, "weight")
        self.plain = nn.Linear(4, 6, bias=False)


def test_declared_parameter_has_its_last_axis_and_others_none():
    m = Tied()
    assert sphere_dim(m.a) == 1 and sphere_dim(m.plain) is None and sphere_dim(m.a, "bias") is None
    entries = declared_spheres(m)
    assert [(e.name, e.dim, e.attr) for e in entries] == [("a.weight", 1, "weight")]  # tied: once
    assert entries[0].module is m.a and entries[0].param is m.a.weight
    assert named_sphere_parameters(m) == [("a.weight", m.a.weight)]


def test_declaration_survives_re_wrapping():
    m = Tied()
    m.load_state_dict({k: v.clone() for k, v in m.state_dict().items()}, assign=True)
    assert type(m.a.weight) is nn.Parameter and sphere_dim(m.a) == 1
    assert named_sphere_parameters(m) == [("a.weight", m.a.weight)]  # the object held now


def test_declaration_refuses_another_axis_and_a_missing_parameter():
    m = nn.Linear(4, 6, bias=False)
    with pytest.raises(ValueError, match=r"Linear\.weight of shape \(6, 4\).* along the last dimension, got dim=0"):
        declare_sphere(m, "weight", dim=0)
    with pytest.raises(KeyError, match="no direct parameter named 'bias'"):
        declare_sphere(m, "bias")
    declare_sphere(m, "weight", dim=1)  # the last axis, by its index
    assert sphere_dim(m) == 1


def test_reader_refuses_other_manifolds_and_undeclared_sphere_tensors():
    m = nn.Linear(4, 6, bias=False)
    declare_manifold(m, "weight", geoopt.Stiefel())
    with pytest.raises(ValueError, match="declared on .*Stiefel"):
        declared_spheres(m)
    assert sphere_dim(m) is None
    u = nn.Module()
    u.w = geoopt.ManifoldParameter(UNIT_SPHERE.random_point(3, 4), manifold=UNIT_SPHERE)
    with pytest.raises(ValueError, match="'w' is a geoopt ManifoldParameter .* does not declare it"):
        named_sphere_parameters(u)


def test_every_reader_sees_the_same_weights_of_an_ngpt():
    model = from_preset("ngpt-tiny")
    names = [name for name, _ in named_sphere_parameters(model)]
    assert len(names) == 2 + 7 * model.config.n_layers  # E_in, E_out, 7 matrices per block (Section 2.6)
    assert all(e.dim == e.param.dim() - 1 for e in declared_spheres(model))
    groups = param_groups(model)
    assert [n for g in groups if g["manifold"] == SPHERE for n, _ in g["params"]] == names
    assert list(model.sphere_weights()) == names  # export's check of unit rows
    assert normalize_(model) == len(names)
    assert spherenet.optim.SPHERE is SPHERE  # one name for the param-group key
