"""Text backbones made in-process, for tasks that ship no pretrained weights (``data=pydoc_topics``): a byte-level
BPE tokenizer (Sennrich et al., ACL 2016, arXiv 1508.07909; RoBERTa's tokenizer family, trained with ``tokenizers``)
and a small RoBERTa pre-trained by masked-language modelling (Devlin et al., NAACL 2019, arXiv 1810.04805: 15 %
masking, 80/10/10; Liu et al., arXiv 1907.11692: dynamic masking, AdamW β 0.9/0.98, linear warm-up and decay),
each saved as a ``save_pretrained`` directory."""
from __future__ import annotations

import json
import logging
import os

import torch

from .text import load_tokenizer, no_hf_progress_bars, tokenize

log = logging.getLogger("fl_lightning")

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # RoBERTa's ids 0..4 (pad 1, as RobertaConfig expects)


def train_tokenizer(texts: list[str], out_dir: str, vocab_size: int) -> None:
    """Byte-level BPE (``tokenizers``) on ``texts``, saved as a RoBERTa ``save_pretrained`` tokenizer directory."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=int(vocab_size), min_frequency=2, special_tokens=list(SPECIALS),
                            show_progress=False)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = RobertaTokenizer(vocab=model["vocab"], merges=merges)
    tok.save_pretrained(out_dir)


# The pre-training recipe's version: part of the backbone's cache key (pydoc_topics.py), so a cached backbone made by
# an earlier recipe (other code, not only other settings) is not reused. 2: one intra-op thread, foreach AdamW,
# progress bar (1: the first recipe, on the run's threads).
RECIPE = 2


def mlm_pretrain(tok_dir: str, texts: list[str], out_dir: str, *, hidden_size: int = 128, layers: int = 2,
                 heads: int = 4, intermediate_size: int = 512, max_length: int = 48, steps: int = 1500,
                 batch_size: int = 32, lr: float = 1e-3, mask_prob: float = 0.15, seed: int = 0,
                 threads: int | None = 1, train: bool = True) -> None:
    """A small RoBERTa pre-trained by masked-language modelling on ``texts`` (``train: false``: left random),
    saved with its tokenizer as a ``save_pretrained`` directory at ``out_dir``. AdamW (β 0.9/0.98, wd 0.01, linear
    warm-up over 6 % of the steps then linear decay: RoBERTa's recipe, scaled down). ``threads``: torch's intra-op
    threads meanwhile (restored after; None: as set): the model is too small for a second thread to pay, and on a
    busy machine two spinning OpenMP threads per process made it several times slower. A bar with ETA on a terminal
    (:class:`fl_lightning.progress.StepProgress`), else a log line at each quarter."""
    import time

    from transformers import RobertaConfig, RobertaForMaskedLM

    from ..progress import StepProgress

    tok = load_tokenizer(tok_dir)
    g = torch.Generator().manual_seed(int(seed))
    torch_state = torch.get_rng_state()
    torch.manual_seed(int(seed))
    cfg = RobertaConfig(vocab_size=len(tok), hidden_size=hidden_size, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=intermediate_size,
                        max_position_embeddings=max_length + 2, type_vocab_size=1, pad_token_id=tok.pad_token_id,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = RobertaForMaskedLM(cfg)
    torch.set_rng_state(torch_state)
    if train:
        steps = int(steps)
        enc = tokenize(tok, texts, None, max_length)
        ids, att = enc["input_ids"].long(), enc["attention_mask"].long()
        special = ids.le(max(tok.all_special_ids))  # ids 0..4 are the special tokens
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01,
                                foreach=True)
        warm = max(1, int(0.06 * steps))
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm))))
        model.train()
        old_threads = torch.get_num_threads()
        if threads:
            torch.set_num_threads(int(threads))
        start, quarter, loss = time.perf_counter(), max(1, steps // 4), float("nan")
        try:
            with StepProgress("MLM pre-training", steps) as bar:
                for step in range(steps):
                    idx = torch.randint(len(ids), (int(batch_size),), generator=g)
                    loss = _mlm_step(model, opt, tok, ids, att, special, idx, mask_prob, g)
                    sched.step()
                    done = step + 1
                    if bar.live:
                        bar.update(done, f"loss {loss:.3f}")
                    elif done % quarter == 0 and done < steps:
                        left = (time.perf_counter() - start) / done * (steps - done)
                        log.info("pydoc_topics MLM pre-training: step %d/%d, loss %.3f, about %.0f s left", done,
                                 steps, loss, left)
        finally:
            torch.set_num_threads(old_threads)
        log.info("pydoc_topics MLM pre-training: %d steps in %.0f s, final loss %.3f", steps,
                 time.perf_counter() - start, loss)
    with no_hf_progress_bars():  # no "Writing model shards" bar (the caller publishes out_dir: data/cache.py)
        model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "fl_lightning_pretraining.json"), "w") as f:
        json.dump({"pretrained": bool(train), "recipe": RECIPE, "steps": int(steps) if train else 0,
                   "corpus": "pydoc_data.topics without the test sentences", "batch_size": batch_size, "lr": lr,
                   "mask_prob": mask_prob, "max_length": max_length}, f)


def _mlm_step(model, opt, tok, ids, att, special, idx: torch.Tensor, mask_prob: float, g: torch.Generator) -> float:
    """One MLM step on the sentences ``idx`` (dynamic masking, 80/10/10); returns the loss."""
    width = int(att[idx].sum(1).max())  # trim the padding columns of this batch (a one-off CPU loop)
    x, a, sp = ids[idx, :width].clone(), att[idx, :width], special[idx, :width]
    masked = (torch.rand(x.shape, generator=g) < mask_prob) & ~sp
    target = x[masked]
    r = torch.rand(x.shape, generator=g)
    x = torch.where(masked & (r < 0.8), torch.full_like(x, tok.mask_token_id), x)
    rand_tok = torch.randint(len(SPECIALS), len(tok), x.shape, generator=g)
    x = torch.where(masked & (r >= 0.8) & (r < 0.9), rand_tok, x)
    hidden = model.roberta(input_ids=x, attention_mask=a).last_hidden_state
    # the LM head on the masked positions only (the loss is over them; 85 % of its cost saved)
    loss = torch.nn.functional.cross_entropy(model.lm_head(hidden[masked]), target)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
    opt.step()
    return float(loss.detach())
