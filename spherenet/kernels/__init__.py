"""The accelerated operations of spherenet, each a plain-torch reference with its native and
Triton implementations registered beside it under one signature."""

from .sphere_adam import sphere_adam_
from .sphere_rows import normalize_rows_, sphere_muon_tail_

__all__ = ["sphere_adam_", "normalize_rows_", "sphere_muon_tail_"]
