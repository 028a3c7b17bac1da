"""SUM: the update is the batch-weighted sum of the pushes it gathers, stepped by the run's
optimizer. A synchronous round's sum of every worker's gradient, each weighted by its share
of the global batch, is the global batch's mean gradient (bsp); an asynchronous push alone,
weighted by its share, moves the weights by that share of a step (asp)."""

from polyrhythm.strategies.server_updates.base import ServerUpdate


class GradientSum(ServerUpdate):
    """The batch-weighted sum of the gathered gradients, one optimizer step."""
