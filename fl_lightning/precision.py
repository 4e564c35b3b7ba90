"""Precision by device: ``ns_dtype: auto`` resolved once at set-up, and one line where bf16 is slow.

The Muon-family papers run Newton–Schulz in bf16 (Jordan et al. 2024, ``muon.py``; seeds 003/004's code), a GPU
speed choice. On a CPU without native bf16 matrix products (no AVX512-BF16, no AMX: e.g. an AVX2 CPU) a bf16 matmul
takes a slow path: one 192×768 by 768×192 product 23.2 ms against 0.65 ms in fp32 (36×), and five Newton–Schulz
steps on ViT-Tiny's 192×768 matrices are also less exact there (1.2e-2 against float64, 2e-6 in fp32). So
``ns_dtype: auto`` (the default wherever the authors say bf16) resolves to

- ``bfloat16`` on CUDA, and on a CPU with native bf16 (``torch.cpu._is_avx512_bf16_supported()`` or
  ``_is_amx_tile_supported()``): the authors' arithmetic;
- ``float32`` anywhere else.

:func:`resolve` writes the resolved dtype into the config before anything is built, so the saved ``config.yaml``,
the config hash and the report see the precision actually used; a resumed run takes it from the run's saved config
(:func:`inherit`), so its arithmetic never changes mid-run, whichever machine resumes it. An explicit ``bfloat16``, and
``trainer.precision=bf16-*``, are honoured everywhere, with one line at start on a CPU without native bf16 giving the
slowdown measured here and the key that changes it.
"""
from __future__ import annotations

import functools
import logging
import time

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

log = logging.getLogger("fl_lightning")

AUTO = "auto"
KEY = "ns_dtype"  # the keys named so, anywhere in the config, take ``auto``


def device_type(cfg: DictConfig) -> str:
    """The device a run's arithmetic runs on, from ``trainer.accelerator`` (auto: CUDA when visible)."""
    acc = str(cfg.trainer.accelerator)
    if acc in ("gpu", "cuda") or (acc == "auto" and torch.cuda.is_available()):
        return "cuda"
    return "cpu" if acc in ("cpu", "auto") else acc


def onednn_has_bf16() -> bool:
    """Whether oneDNN runs bf16 primitives on this CPU (honours ``ONEDNN_MAX_CPU_ISA``)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX, and oneDNN using them (a CPU's bf16 matrix products go through oneDNN; with its ISA capped,
    ``ONEDNN_MAX_CPU_ISA=AVX2``, they take the slow path as on an AVX2 CPU)."""
    return bool((torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()) and onednn_has_bf16())


def native_bf16(device: str) -> bool:
    return device == "cuda" or (device == "cpu" and cpu_has_native_bf16())


def auto_dtype(device: str) -> str:
    return "bfloat16" if native_bf16(device) else "float32"


def _keys(node, prefix: str = ""):
    """``(parent node, key, full key)`` for every ``ns_dtype`` key in ``node``."""
    if isinstance(node, DictConfig):
        for k in node.keys():
            full = f"{prefix}{k}"
            if k == KEY:
                yield node, k, full
            else:
                child = node._get_node(k)
                if isinstance(child, (DictConfig, ListConfig)):
                    yield from _keys(child, f"{full}.")
    elif isinstance(node, ListConfig):
        for i, child in enumerate(node._iter_ex(resolve=False)):
            if isinstance(child, (DictConfig, ListConfig)):
                yield from _keys(child, f"{prefix}{i}.")


def _value(node: DictConfig, key: str):
    try:
        return node[key]
    except Exception:  # an interpolation that cannot resolve here is left for the config checks
        return None


def dtype_keys(cfg: DictConfig) -> dict[str, object]:
    """Every ``ns_dtype`` key of ``cfg`` (its full key) with its value (``auto`` before :func:`resolve`)."""
    return {full: _value(node, key) for node, key, full in _keys(cfg)}


def inherit(cfg: DictConfig, saved: DictConfig | None) -> list[str]:
    """Where ``cfg`` says ``auto`` and the run's saved config (a resume) holds a resolved dtype at the same key,
    take the saved one. Returns the keys taken."""
    if saved is None:
        return []
    taken = []
    for node, key, full in list(_keys(cfg)):
        if _value(node, key) == AUTO:
            old = OmegaConf.select(saved, full, default=None)
            if old is not None and old != AUTO:
                with open_dict(node):
                    node[key] = old
                taken.append(full)
    return taken


def resolve(cfg: DictConfig, saved: DictConfig | None = None) -> dict[str, str]:
    """Resolve every ``ns_dtype: auto`` in ``cfg`` in place (a resume's saved value first, else by device), log
    one line, and say in one line what runs slowly here. Returns ``{full key: dtype}`` for the keys resolved."""
    inherit(cfg, saved)
    device = device_type(cfg)
    resolved = {}
    for node, key, full in list(_keys(cfg)):
        if _value(node, key) == AUTO:
            with open_dict(node):
                node[key] = resolved[full] = auto_dtype(device)
    if resolved:
        keys = sorted(resolved)
        why = ("the authors' bf16" if native_bf16(device) else
               "fp32: this CPU has no native bf16 (AVX512-BF16 or AMX), where bf16 Newton-Schulz is slower and less exact")
        log.info("%s auto -> %s on %s (%s); set %s=bfloat16 or =float32 to choose", ", ".join(keys),
                 resolved[keys[0]], device, why, keys[0])
    warn_slow_bf16(cfg, device)
    return resolved


@functools.lru_cache(maxsize=1)
def cpu_bf16_slowdown() -> float:
    """How much slower a bf16 matrix product is than an fp32 one on this CPU (one-time, about 0.1 s on a CPU
    without native bf16): ViT-Tiny's 192×768 by 768×192, best of 3, one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(192, 768), torch.randn(768, 192)
        best = {}
        for dtype in (torch.float32, torch.bfloat16):
            x, y = a.to(dtype), b.to(dtype)
            x @ y
            times = []
            for _ in range(3):
                t = time.perf_counter()
                x @ y
                times.append(time.perf_counter() - t)
            best[dtype] = min(times)
        return best[torch.bfloat16] / max(best[torch.float32], 1e-9)
    finally:
        torch.set_num_threads(threads)


def warn_slow_bf16(cfg: DictConfig, device: str) -> list[str]:
    """One line each for bf16 asked for explicitly on a CPU without native bf16: Newton–Schulz (``*.ns_dtype``) and
    ``trainer.precision``. The run goes on: it is the user's choice. Returns the lines."""
    if device != "cpu" or cpu_has_native_bf16():
        return []
    keys = sorted(k for k, v in dtype_keys(cfg).items() if v == "bfloat16")
    prec = str(cfg.trainer.get("precision", "32-true"))
    if not keys and not prec.startswith("bf16"):
        return []
    n = cpu_bf16_slowdown()
    lines = []
    if keys:
        lines.append(f"{keys[0]}=bfloat16 on a CPU without native bf16: its matrix products run about {n:.0f}x slower "
                     f"than fp32 here; {keys[0]}=auto (or float32) runs Newton-Schulz in fp32")
    if prec.startswith("bf16"):
        lines.append(f"trainer.precision={prec} on a CPU without native bf16: matrix products run about {n:.0f}x slower "
                     "than fp32 here; trainer.precision=32-true is faster")
    for line in lines:
        log.warning(line)
    return lines
