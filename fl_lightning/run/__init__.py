"""Composing, building and placing a run: the command line (``cli.py``: one-line errors, the run's life), the build
(``build.py``: checks, Fabric, data, model, strategy -> the loop) and the run directory (``run_dir.py``)."""
