"""smplan: plan, simulate and run distributed deep-learning training."""

__version__ = "0.1.0"
