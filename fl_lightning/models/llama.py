"""LLaMA (Touvron et al., "LLaMA: Open and Efficient Foundation Language Models", arXiv 2302.13971) from scratch:
a Hugging Face ``LlamaForCausalLM`` built from a ``LlamaConfig`` (no download, no remote code), for
:class:`~fl_lightning.models.causal_lm.CausalLMModule`.

Seed 001 (FedPAC, Sec. 6.3, Table 3) names LLaMA 60M / 130M / 350M on C4 without their configurations
(decision 001/#29 in docs/decisions.md); the yamls use the ones the literature uses under these names (GaLore, Zhao
et al., ICML 2024, arXiv 2403.03507, ``configs/llama_*.json``): hidden / intermediate / heads / layers 512/1376/8/8,
768/2048/12/12, 1024/2736/16/24, vocabulary 32,000 (the T5 tokenizer's), untied embeddings, RMSNorm eps 1e-6, SiLU,
RoPE, sequence length 256: 58,073,600 / 134,105,856 / 367,969,280 parameters
(``tests/unit/models/test_language_models.py`` builds them on the meta device). ``vocab_size: null`` takes the
dataset's (the tokenizer's size).
"""
from __future__ import annotations

from typing import Annotated

from ..data.info import DataInfo
from ..errors import ConfigError
from ..config import OneOf, Positive, Range
from ._args import Depth, Width, positive_ints


def llama(info: DataInfo, hidden_size: Width = 512, intermediate_size: Width = 1376, heads: Depth = 8,
          layers: Depth = 8, max_length: Annotated[int, Range(1, 1 << 20)] = 256,
          vocab_size: Annotated[int, Range(1, 1 << 21)] | None = None, rms_norm_eps: Positive = 1e-6,
          attn_implementation: Annotated[str, OneOf("sdpa", "eager", "flash_attention_2")] = "sdpa"):
    """``LlamaForCausalLM`` for ``info``'s tokens; ``vocab_size`` null = ``info.vocab_size``. An explicit vocabulary
    smaller than the tokenizer's is accepted when the dataset reports that its ids stay below it (provenance
    ``max_token_id``: the T5 tokenizer counts 32,100 with its 100 sentinel ids, which text never produces)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden_size, intermediate_size, heads, layers, max_length = (
        positive_ints(v, k, 1, d)[0] for k, v, d in (("hidden_size", hidden_size, "512"),
                                                     ("intermediate_size", intermediate_size, "1376"),
                                                     ("heads", heads, "8"), ("layers", layers, "8"),
                                                     ("max_length", max_length, "256")))
    if hidden_size % heads:
        raise ConfigError("heads", f"{heads} heads do not divide hidden_size {hidden_size}", "use 8 heads with 512")
    vocab = _vocab(info, vocab_size)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden_size, intermediate_size=intermediate_size,
                      num_attention_heads=heads, num_key_value_heads=heads, num_hidden_layers=layers,
                      max_position_embeddings=max_length, rms_norm_eps=float(rms_norm_eps), tie_word_embeddings=False,
                      hidden_act="silu", use_cache=False)
    cfg._attn_implementation = str(attn_implementation)
    return LlamaForCausalLM(cfg)


def _vocab(info: DataInfo, vocab_size: int | None) -> int:
    if not info.vocab_size:
        raise ConfigError("", "LLaMA needs a token dataset (DataInfo.vocab_size is None)", "use data=c4 or data=pydoc_chars")
    if vocab_size is None:
        return int(info.vocab_size)
    (vocab,) = positive_ints(vocab_size, "vocab_size", 1, "32000")
    top = int(dict(info.provenance or ()).get("max_token_id", info.vocab_size - 1))
    if top >= vocab:
        raise ConfigError("vocab_size", f"is {vocab} but the dataset's token ids reach {top} "
                          f"(tokenizer size {info.vocab_size})", "set model.net.vocab_size=null (the tokenizer's size)")
    return vocab
