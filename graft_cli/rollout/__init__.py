"""Rollout engines. Importing this package registers the built-in ones (``hf``; ``vllm`` when installed)."""

from graft_cli.rollout import hf  # noqa: F401  (registers "hf")
from graft_cli.rollout.base import ENGINES, Rollouts, SamplingParams  # noqa: F401

if __import__("importlib.util").util.find_spec("vllm") is not None:  # "vllm" where installed (imported lazily)
    from graft_cli.rollout import vllm  # noqa: F401
