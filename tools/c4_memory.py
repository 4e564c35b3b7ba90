"""Memory of the C4 loader against corpus size (issue 10): fabricated ``c4-*.json.gz`` shards of growing size
(random words, 4 URL hosts), tokenized by a small in-process BPE tokenizer, then in a fresh process the federated
view (20 clients, IID) and 200 training batches of 16 x 256 tokens plus one pass over the held-out sequences.

Reports per corpus: tokens, token-file MiB, the peak resident memory of the tokenizing process (``VmHWM``), and the
anonymous resident memory (``RssAnon``: not the page cache of the mapped file) of the training-side process after
the batches. Usage: ``python tools/c4_memory.py [--docs 20000 200000]`` (writes nothing outside a temp folder).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this worktree's fl_lightning and tests helpers


def status(field: str) -> int:
    """A /proc/self/status field in KiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def fabricate(root: str, docs: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(2000)]
    os.makedirs(root, exist_ok=True)
    for name, count in (("train", docs), ("validation", 2000)):
        with gzip.open(os.path.join(root, f"c4-{name}.00000-of-00001.json.gz"), "wt", compresslevel=1) as f:
            for i in range(count):
                text = " ".join(words[j] for j in rng.integers(0, 2000, 200))
                f.write(json.dumps({"text": text, "url": f"https://h{i % 4}.example.org/{i}"}) + "\n")


def tokenize(root: str, tok: str, cache: str) -> None:
    from fl_lightning.data.c4 import c4

    train, _, info = c4(root, tok, cache_dir=cache)
    mib = os.path.getsize(os.path.join(train.folder, "tokens.bin")) / 2**20
    print(json.dumps({"tokens": int(dict(info.provenance)["data_train_tokens"]), "file_mib": round(mib, 1),
                      "build_peak_mib": round(status("VmHWM") / 1024, 1)}))


def train_side(root: str, tok: str, cache: str) -> None:
    import torch
    from omegaconf import OmegaConf

    from fl_lightning.config import StepBudget
    from fl_lightning.data import build_federated_data

    base = status("RssAnon")
    cfg = OmegaConf.create({"_target_": "fl_lightning.data.c4.c4", "root": root, "tokenizer_path": tok,
                            "cache_dir": cache, "batch_size": 16, "eval_batch_size": 64, "eval_sequences": 256,
                            "partition": {"_target_": "fl_lightning.data.partition.iid"}})
    data = build_federated_data(cfg, 20, 0, torch.device("cpu"))
    for c in range(20):
        for _ in data.client_batches(c, 0, "cpu", StepBudget(steps=10)):
            pass
    for _ in data.test_batches("cpu"):
        pass
    print(json.dumps({"sequences": len(data.train), "run_rss_anon_mib": round(status("RssAnon") / 1024, 1),
                      "run_rss_anon_over_imports_mib": round((status("RssAnon") - base) / 1024, 1)}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, nargs="+", default=[20000, 200000])
    ap.add_argument("--stage", choices=["tokenize", "train"])
    ap.add_argument("--root"), ap.add_argument("--tok"), ap.add_argument("--cache")
    a = ap.parse_args()
    if a.stage:
        (tokenize if a.stage == "tokenize" else train_side)(a.root, a.tok, a.cache)
        return
    from tests.helpers.text_files import bpe_tokenizer

    with tempfile.TemporaryDirectory() as d:
        tok = bpe_tokenizer(os.path.join(d, "tok"), 2000)
        print("| documents | tokens | token file (MiB) | tokenizing peak RSS (MiB) | training-side RssAnon (MiB) |")
        print("| --- | --- | --- | --- | --- |")
        for n in a.docs:
            root, cache = os.path.join(d, f"c4_{n}"), os.path.join(d, f"cache_{n}")
            fabricate(root, n)
            out = {}
            for stage in ("tokenize", "train"):
                p = subprocess.run([sys.executable, __file__, "--stage", stage, "--root", root, "--tok", tok,
                                    "--cache", cache], capture_output=True, text=True, cwd=ROOT,
                                   env=dict(os.environ, OMP_NUM_THREADS="1"))
                out.update(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"| {n:,} | {out['tokens']:,} | {out['file_mib']} | {out['build_peak_mib']} | "
                  f"{out['run_rss_anon_mib']} |", flush=True)


if __name__ == "__main__":
    main()
