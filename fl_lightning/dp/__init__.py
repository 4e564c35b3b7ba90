"""User-level differential privacy as strategy parts (the ``dp`` config group, conf/dp/): the clip on each client's
whole upload (:mod:`.clip`), Gaussian noise on the round's sum (:mod:`.noise`), the adaptive clip (:mod:`.adaptive`),
the accountant and calibration (:mod:`.accountant`), the group's targets (:mod:`.mechanism`). docs/usage.md, "Differential
privacy"."""
from .mechanism import AdaptiveCentralDP, CentralDP, attach_dp

__all__ = ["AdaptiveCentralDP", "CentralDP", "attach_dp"]
