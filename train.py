"""Entry point: ``python train.py [overrides]`` (see README). Composes conf/ with Hydra and runs one federated job."""
import os
import sys

import hydra

from fl_lightning.cli import check_groups, check_keys, check_resume, run

CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg):
    run(cfg)


if __name__ == "__main__":
    check_groups(sys.argv[1:], CONF)
    check_resume(sys.argv[1:])
    check_keys(sys.argv[1:], CONF)
    main()
