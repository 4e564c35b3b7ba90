"""A run of several processes and its signals: the peers (``peers.py``: the shared run directory, heartbeat, a lost
rank named), signals during set-up (``signals.py``) and Slurm's requeue (``slurm.py``)."""
