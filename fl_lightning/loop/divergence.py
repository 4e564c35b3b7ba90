"""The one line a run that diverged stops with: the learning rate that grew the loss, and the last good checkpoint.
``c``: the loop's config (:class:`~fl_lightning.loop.loop.LoopConfig`: the keys a user types for the clients' and
the server's learning rate); ``last``: the newest checkpoint, or None."""
from __future__ import annotations

import math


def divergence_line(c, last: str | None, r: int, cid: int, mean_loss: float, first_loss: float) -> str:
    """One line naming the learning rate that grew the loss: finite at the model the client received, then not,
    the client steps did (the clients' lr); already not finite there, the server's step of an earlier round did
    (the server's lr), or, in round 1, the initial model or the data."""
    where = f"; last good checkpoint: {last}" if last else "; no checkpoint was written yet"
    head = f"training loss became {mean_loss} at round {r + 1}, client {cid}"
    if math.isfinite(first_loss):
        fix = f"lower the clients' learning rate ({c.client_lr_key or 'the local optimizer lr'}) or set method.grad_clip"
        return f"{head}, growing over its local steps from {first_loss:.4g}: {fix}{where}"
    if r == 0:
        return (f"{head}: the loss is {first_loss} already at the initial model: check the data for NaN/inf "
                f"inputs and the model's initialisation{where}")
    server = c.server_lr_key or "the server step's learning rate"
    return (f"{head}: the loss is {first_loss} already at the global model the server sent, so the server's "
            f"update grew it: lower the server's learning rate ({server}){where}")
