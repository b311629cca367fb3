"""``kernels_set_to(name)``: the kernels' setting (:func:`spherenet.kernels.configure`) for the
body of a ``with`` block, the previous one restored after it, for the tests that run a model or an
op with every implementation in turn."""

import contextlib

from spherenet import kernels


@contextlib.contextmanager
def kernels_set_to(name: str):
    previous = kernels.configure(name)
    try:
        yield
    finally:
        kernels.configure(previous)
