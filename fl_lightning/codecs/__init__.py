"""Codecs for uploads and broadcasts (one file each): what the receiver rebuilds and the exact bits that travel."""
from .base import Codec, Dense, dense_bits
from .clamp import Clamp
from .error_feedback import ErrorFeedback
from .lion_momentum import LionMomentum
from .lowrank import LowRankSVD
from .quantize import Quantize
from .sign import ScaledSign, Sign
from .topk import TopK

__all__ = ["Clamp", "Codec", "Dense", "ErrorFeedback", "LionMomentum", "LowRankSVD", "Quantize", "ScaledSign", "Sign",
           "TopK", "dense_bits"]
