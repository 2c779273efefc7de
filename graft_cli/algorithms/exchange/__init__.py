"""Exchange steps (registry ``EXCHANGES``): how the policies' step data becomes each policy's
TrainBatch.

* :mod:`.base` — the interface (``Exchange``, ``ExchangeContext``, ``Receivers``) and ``none``
  (independent GRPO)
* :mod:`.selection`, :mod:`.replacement`, :mod:`.gates` — GRAFT's registered parts
* :mod:`.graft` — GRAFT composed from them; :mod:`.graft_stored` — its stored-trajectory defaults
"""

from graft_cli.algorithms.exchange import graft, graft_stored  # noqa: F401  (register graft, graft_stored)
from graft_cli.algorithms.exchange.base import (  # noqa: F401
    EXCHANGES,
    Exchange,
    ExchangeContext,
    ReceiverFunctions,
    Receivers,
)
