"""The trainer's minibatch schedule and micro-batching over a :class:`graft_cli.batch.TrainBatch`.

The orderings are registered in :mod:`graft_cli.algorithms.minibatch` (``exchange.ordering``); the trainer
calls :func:`minibatch_plan`. :func:`minibatch_schedule` is the group ordering with an explicit number of
minibatches."""

from __future__ import annotations

from graft_cli.algorithms.minibatch import MINIBATCH_ORDERINGS, MinibatchSize, minibatch_plan  # noqa: F401
from graft_cli.algorithms.minibatch import group_schedule as minibatch_schedule  # noqa: F401
from graft_cli.batch import TrainBatch, micro_batches  # noqa: F401  (re-exported)
