"""graft: cross-model RLVR (GRAFT, GRPO and baselines) for LLMs on math."""

__version__ = "0.1.0"
