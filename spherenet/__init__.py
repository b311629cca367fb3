"""spherenet: neural networks whose weights and hidden states live on the unit hypersphere."""

__version__ = "0.1.0"
