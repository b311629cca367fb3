"""Inspect a trained nGPT or GPT the way Section 3.2 of the nGPT paper does, and plot it.

Every function takes a model (:class:`~spherenet.models.NGPT` or :class:`~spherenet.models.GPT`,
also when wrapped by ``torch.compile`` or DDP) and returns plain data: dicts of float64 numpy
arrays and Python floats, ready for JSON or for the ``plot_*`` functions.

- :func:`embedding_stats` (Fig. 4): norms of the rows of the input and output embeddings, the
  eigenvalues of their covariance divided by the median eigenvalue, and pairwise dot products.
- :func:`condition_numbers` (Fig. 5; Fig. 10's dotted lines with ``normalize=True``): per layer,
  the median over heads of the condition numbers of the attention matrices, and the condition
  numbers of the three MLP matrices.
- :func:`scaling_factors` (Fig. 6 and 14): per layer the eigen learning rates alpha_A, alpha_M
  (eq. 10, 11) and the scalings s_qk (eq. 15, 16), s_u, s_v (eq. 20, 21), and s_z (eq. 3).
- :func:`length_extrapolation` (Appendix A.7, Fig. 13): validation loss at 1x, 2x, 4x the
  training context, on the same scored tokens.
- :func:`sphere_norm_error`, :func:`eigen_learning_rates`: what training logs while it runs
  (every rank calls them).

The ``plot_*`` functions draw several models on one figure (e.g. nGPT against GPT, as the
paper's figures do) into a small PNG (matplotlib's Agg backend, 80 dpi). Nothing here trains or
modifies the model it is given.
"""

from .diagnostics import eigen_learning_rates, sphere_norm_error
from .embeddings import embedding_stats
from .extrapolation import length_extrapolation, with_max_seq_len
from .plots import plot_condition_numbers, plot_embeddings, plot_extrapolation, plot_scalings
from .scalings import scaling_factors
from .spectra import CONDITION_KEYS, condition_number, condition_numbers

__all__ = [
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
    "sphere_norm_error",
    "eigen_learning_rates",
]
