"""Composable strategy parts (one file each)."""
from .local_optimizer import LocalOptimizer, flatten_optimizer_state, load_flat_optimizer_state
from .model_average import ModelAverage

__all__ = ["LocalOptimizer", "ModelAverage", "flatten_optimizer_state", "load_flat_optimizer_state"]
