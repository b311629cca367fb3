"""``python -m spherenet``: a short tour of the three residual updates on the sphere.

Two unit vectors at angle theta; each update moves ``a`` towards ``b`` by ``alpha``. Prints the
angle travelled: SLERP moves exactly ``alpha * theta`` (eq. 6), LERP (eq. 10) and the
Riemannian update (eq. 25) approximate it and take the same first-order step.
"""

import math

import torch

from spherenet.manifolds import Sphere, angle, lerp, normalize, riemannian_update, slerp, tangent


def main() -> None:
    torch.manual_seed(0)
    d = 1024
    a = Sphere().random_point(1, d, dtype=torch.float64)
    print(f"unit vectors in R^{d}; angle travelled from a towards b (radians)")
    print(f"{'theta':>6} {'alpha':>6} {'alpha*theta':>12} {'lerp':>8} {'slerp':>8} {'riemannian':>10}")
    for theta in (0.5, 1.5, 3.0):
        w = normalize(tangent(a, torch.randn(1, d, dtype=torch.float64)))
        b = math.cos(theta) * a + math.sin(theta) * w
        for alpha in (0.05, 0.3):
            moved = [angle(a, f(a, b, alpha)).item() for f in (lerp, slerp, riemannian_update)]
            print(f"{theta:6.2f} {alpha:6.2f} {alpha * theta:12.4f} " + " ".join(f"{m:8.4f}" for m in moved))
    out = slerp(a, b, torch.rand(d, dtype=torch.float64))  # per-dimension alpha, then retracted
    print(f"per-dimension alpha: |slerp| = {out.norm().item():.12f}")


if __name__ == "__main__":
    main()
