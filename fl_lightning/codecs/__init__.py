"""Codecs for uploads and broadcasts (one file each): what the receiver rebuilds and the exact bits that travel."""
from .base import Codec, Dense, UnbiasedCodec, dense_bits
from .clamp import Clamp
from .error_feedback import ErrorFeedback
from .heavy_sign import HeavySign
from .lion_momentum import LionMomentum
from .lowrank import LowRankSVD
from .quantize import Quantize
from .randk import RandK
from .sign import ScaledSign, Sign
from .sign_steps import SignSteps
from .topk import TopK

__all__ = ["Clamp", "Codec", "Dense", "ErrorFeedback", "HeavySign", "LionMomentum", "LowRankSVD", "Quantize", "RandK",
           "ScaledSign", "Sign", "SignSteps", "TopK", "UnbiasedCodec", "dense_bits"]
