"""The module ``model.net._target_: fl_lightning.models.resnet_gn.resnet18_gn`` pointed at before ResNet-18 took
``norm`` and ``stem`` options (kept so that older configs and run directories still build): see ``resnet.py``."""
from .resnet import BasicBlock, ResNet18, ResNet18GN, resnet18, resnet18_gn  # noqa: F401
