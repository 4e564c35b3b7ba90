"""The model of the matrix-quadratic testbed for seed 003's heavy-tailed-noise result (ours; the problem, the noise
and their source: ``fl_lightning/data/matrix_quadratic.py``).

The only parameter is the matrix X ∈ R^{m×n} (m×n from ``info.input_shape``, initialised at 0), so Muon's
orthogonalised step applies to it. On a batch of examples (A, X_k*, σZ) the loss is the mean over the batch of
``½‖A(X − X_k*)‖_F² + ⟨σZ, X⟩``, whose gradient is exactly ``AᵀA(X − X_k*) + σZ`` = ∇f_k(X) + noise (one example
per step with ``data.batch_size=1``). Evaluation on the test example (A, X*): ``grad_norm`` = ‖∇f(X)‖_F =
‖AᵀA(X − X*)‖_F of the global objective (primary, minimised; Zhang & Gao's Thms 5.1 and 5.5 bound its average over
the steps, here it is taken at the global model after each round) and ``excess_loss`` = f(X) − f* =
½‖A(X − X*)‖_F², both in float64.
"""
from __future__ import annotations

import lightning as L
import torch
from torch import Tensor, nn

from ..data.info import DataInfo
from ..errors import ConfigError


class MatrixQuadraticModule(L.LightningModule):
    """X (a trainable m×n matrix) under the batch's quadratic + linear-noise loss."""

    primary_metric: tuple[str, str] = ("grad_norm", "min")

    def __init__(self, info: DataInfo):
        super().__init__()
        if info.input_shape is None or len(info.input_shape) != 2:
            raise ConfigError("", f"needs a dataset whose examples are m×n matrix problems (input_shape {info.input_shape})",
                              "use data=matrix_quadratic")
        self.x = nn.Parameter(torch.zeros(info.input_shape))
        self._sums: list[Tensor] = []

    def training_step(self, batch: dict, batch_idx: int = 0) -> Tensor:
        residual = torch.matmul(batch["a"], self.x - batch["target"])
        quadratic = 0.5 * residual.square().sum(dim=(1, 2))
        linear = (batch["noise"] * self.x).sum(dim=(1, 2))
        return (quadratic + linear).mean()

    @torch.no_grad()
    def validation_step(self, batch: dict, batch_idx: int = 0) -> Tensor:
        a = batch["a"].double()
        residual = torch.matmul(a, self.x.double() - batch["target"].double())
        grad = torch.matmul(a.transpose(1, 2), residual)
        excess = 0.5 * residual.square().sum(dim=(1, 2))
        self._sums.append(torch.stack([grad.square().sum(dim=(1, 2)).sqrt().sum(), excess.sum(),
                                       torch.tensor(float(len(a)), dtype=torch.float64, device=a.device)]))
        return excess.mean()

    def compute_eval(self) -> dict[str, float]:
        """Mean over the test examples (one: the global problem) since the last call; resets."""
        g, excess, count = torch.stack(self._sums).sum(0).tolist()
        self._sums = []
        return {"grad_norm": g / count, "excess_loss": excess / count}

    def configure_optimizers(self):  # pragma: no cover - strategies build the local optimizers
        raise NotImplementedError("fl_lightning strategies build optimizers")
