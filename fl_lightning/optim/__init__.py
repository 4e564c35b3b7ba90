"""Optimizers: the Muon family (Newton–Schulz orthogonalization, the spectral LMO, Muon with an aux optimizer)."""

from .muon import Muon, momentum_coeffs, muon_param_names, split_muon_params, update_scale
from .newton_schulz import (
    NS_COEFFS,
    as_matrix,
    lmo_spectral,
    matrix_shape,
    ns_polynomial,
    orthogonalize,
    resolve_coeffs,
)

__all__ = [
    "NS_COEFFS",
    "Muon",
    "as_matrix",
    "lmo_spectral",
    "matrix_shape",
    "momentum_coeffs",
    "muon_param_names",
    "ns_polynomial",
    "orthogonalize",
    "resolve_coeffs",
    "split_muon_params",
    "update_scale",
]
