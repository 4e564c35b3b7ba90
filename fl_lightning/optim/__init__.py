"""Optimizers: Lion (seed 002), the Muon family (Newton–Schulz orthogonalization, the spectral LMO, Muon with an aux optimizer) and
SOAP and Sophia (seed 001), and the state adapters through which federated parts move optimizer state."""

from .adapters import AdamAdapter, SGDAdapter, StateAdapter, adapter_for, register_adapter
from .muon import (Muon, MuonAdapter, momentum_coeffs, momentum_update, muon_param_names, muon_update,
                   split_muon_params, update_scale)
from .lion import Lion, LionAdapter, lion_update
from .soap import SOAP, SOAPAdapter
from .sophia import Sophia, SophiaAdapter
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
    "Lion",
    "LionAdapter",
    "lion_update",
    "SOAP",
    "SOAPAdapter",
    "Sophia",
    "SophiaAdapter",
    "AdamAdapter",
    "MuonAdapter",
    "SGDAdapter",
    "StateAdapter",
    "adapter_for",
    "momentum_update",
    "muon_update",
    "register_adapter",
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
