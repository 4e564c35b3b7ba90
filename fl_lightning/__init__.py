"""fl_lightning: federated-learning optimization research on Lightning Fabric.

The shape (see README and docs/design.md): ``train.py`` composes a Hydra config, :func:`fl_lightning.run.build.build`
turns it into a Fabric, a LightningModule, a :class:`FederatedData` and a :class:`Strategy`, and
:class:`fl_lightning.loop.FederatedLoop` runs the rounds.
"""

__version__ = "0.1.0"
