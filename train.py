"""Entry point: ``python3 train.py [overrides]`` (see README). Composes conf/ with Hydra and runs one federated job."""
import os
import sys

from fl_lightning.run import cli
from fl_lightning.dist import peers, signals
from fl_lightning import threads

signals.install()  # from here on SIGINT / SIGTERM during set-up end the run at once, with one line
threads.passive_wait()  # idle OpenMP threads sleep (before torch loads): fast on a busy machine too
peers.quiet_cpp_warnings()  # a lost peer is one line, not torch's C++ socket warnings with stack frames

import hydra  # noqa: E402

CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg):
    return cli.task(cfg)  # the objective's final value, for a sweeper that searches


if __name__ == "__main__":
    cli.main(main, sys.argv[1:], CONF)
