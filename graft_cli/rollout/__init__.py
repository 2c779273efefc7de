"""Rollout engines. Importing this package registers the built-in ones (``hf``, ``tandem``; ``vllm``
when installed)."""

from graft_cli.rollout import hf, tandem, vllm_server  # noqa: F401  (register "hf", "tandem", "vllm_server")
from graft_cli.rollout.engine import ENGINES, RolloutEngine, SamplingParams, solo_engine  # noqa: F401  (the API)

if __import__("importlib.util").util.find_spec("vllm") is not None:  # "vllm" where installed (imported lazily)
    from graft_cli.rollout import vllm  # noqa: F401
