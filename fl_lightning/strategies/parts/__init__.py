"""Composable strategy parts (one file each)."""
from .local_optimizer import LocalOptimizer
from .model_average import ModelAverage

__all__ = ["LocalOptimizer", "ModelAverage"]
# Muon-family parts (seeds 000 / 003 / 004) and SCAFFOLD
from .global_alignment import GlobalAlignment
from .lmo_control_variates import LMOControlVariates
from .optimizer_state_average import OptimizerStateAverage
from .scaffold import ScaffoldCorrection
from .step_order import MuonStepOrder

__all__ += ["GlobalAlignment", "LMOControlVariates", "OptimizerStateAverage", "ScaffoldCorrection", "MuonStepOrder"]
# second-order local optimizers (seed 001)
from .preconditioned_mixing import PreconditionedMixing
from .preconditioner_drift import PreconditionerDrift
from .sophia_hessian import SophiaHessian

__all__ += ["PreconditionedMixing", "PreconditionerDrift", "SophiaHessian"]
# first-order baselines
from .proximal_term import ProximalTerm

__all__ += ["ProximalTerm"]
# seed 003's variance-reduced and adaptive baselines
from .bi_clip import BiClip
from .momentum_correction import MomentumCorrection
from .shared_adaptive_storm import SharedAdaptiveStorm

__all__ += ["BiClip", "MomentumCorrection", "SharedAdaptiveStorm"]

# sign uploads (seed 002)
from .magnitude_uniformity import MagnitudeUniformity

__all__ += ["MagnitudeUniformity"]

# seed 002's ablations and comparison methods
from .ef21 import EF21Aggregation
from .local_lion_step import LocalLionStep
from .momentum_completion import MomentumCompletion
from .scallion import Scallion
from .shared_momentum import SharedMomentum
from .sign_downlink import SignDownlink

__all__ += ["EF21Aggregation", "LocalLionStep", "MomentumCompletion", "Scallion", "SharedMomentum", "SignDownlink"]
