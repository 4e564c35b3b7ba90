"""Framework overhead: the FederatedLoop against a bare training loop doing the same local steps.

    python tools/bench_overhead.py [hydra overrides...]

Runs R rounds through FederatedLoop (client sampling, weight swap, client-state checkout/checkin, streaming
sums, server update; evaluation off except the last round) and then the same number of optimizer steps on the
same batches in a plain PyTorch loop, and prints both times and the overhead per client-round.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import open_dict  # noqa: E402

from fl_lightning import seeding  # noqa: E402
from fl_lightning.run.build import build  # noqa: E402


def main(overrides: list[str]) -> None:
    conf = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
    ov = ["trainer.progress=false", "checkpoint.every=100000", "fl.eval_every=100000"] + overrides
    from fl_lightning.config.schema import register

    register()  # the config schema, conf/config.yaml's first default
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        cfg = compose(config_name="config", overrides=ov)
    with tempfile.TemporaryDirectory() as d:
        with open_dict(cfg):
            cfg.run_dir = d
        loop = build(cfg, d)
        loop.setup()
        t = time.perf_counter()
        loop.run(progress_enabled=False)
        fl_time = time.perf_counter() - t
        R, S = loop.R, loop.S
        # bare loop: same clients, same batches, one optimizer, no swapping / aggregation
        module, data = loop.module, loop.data
        opt = torch.optim.SGD(module.parameters(), lr=0.01)
        steps = 0
        t = time.perf_counter()
        for r in range(R):
            for cid in seeding.sample_clients(loop.seed, r, loop.n, S):
                for k, batch in enumerate(data.client_batches(cid, r, loop.device, loop.budget)):
                    loss = module.training_step(batch, k)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    steps += 1
        module.eval()
        for b in data.test_batches(loop.device):
            module.validation_step(b)
        module.compute_eval()
        bare = time.perf_counter() - t
    cr = R * S
    print(f"method={cfg.method.name} model={cfg.model.name} data={cfg.data.name} rounds={R} clients/round={S} steps={steps}")
    print(f"FederatedLoop: {fl_time:.2f} s   bare loop: {bare:.2f} s   overhead: {(fl_time - bare) / cr * 1e3:.2f} ms per client-round "
          f"({100 * (fl_time - bare) / bare:.0f}% of bare)")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="train.py overrides (e.g. method=fedmuon model=vit_tiny)")
    main(ap.parse_intermixed_args().overrides)
