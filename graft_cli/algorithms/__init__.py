"""Registered algorithm pieces: pure functions over tensors and small stateful classes, looked up by
name.

Importing this package registers every built-in piece (each module registers its own):

* :mod:`.advantages` — group-relative advantage estimators (``ADVANTAGES``)
* :mod:`.losses`, :mod:`.peer_losses` — policy losses with one signature (``POLICY_LOSSES``)
* :mod:`.signals` — per-token signals: loss masks (``LOSS_MASKS``) and token advantages
  (``TOKEN_ADVANTAGES``)
* :mod:`.correction` — truncated importance sampling of the rollout/trainer mismatch
  (``IS_CORRECTIONS``)
* :mod:`.minibatch` — minibatch orderings of a step's batch (``MINIBATCH_ORDERINGS``,
  ``exchange.ordering``)
* :mod:`.controllers` — stateful coefficient schedules saved in checkpoints (``CONTROLLERS``)
* :mod:`.exchange` — cross-model exchange steps (``EXCHANGES``) and their parts
"""

from graft_cli.algorithms import advantages, controllers, correction, losses, peer_losses, signals  # noqa: F401
from graft_cli.algorithms import minibatch  # noqa: F401
from graft_cli.algorithms import exchange, opd  # noqa: F401
from graft_cli.algorithms.controllers import CONTROLLERS  # noqa: E402,F401
from graft_cli.algorithms.minibatch import MINIBATCH_ORDERINGS  # noqa: E402,F401
from graft_cli.algorithms.signals import LOSS_MASKS, TOKEN_ADVANTAGES  # noqa: E402,F401
