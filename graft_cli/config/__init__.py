"""A run's config: **compose** (the Hydra tree in ``experiments/`` and the overrides, merged into
the schema: :mod:`graft_cli.config.compose`) → **resolve** (the values the config implies, written
in: :mod:`graft_cli.config.resolve`) → **validate** (ranges and cross-field rules, nothing changed:
:mod:`graft_cli.config.validate`). Every failure is one line naming the key."""

from graft_cli.config.compose import (EXPERIMENTS_DIR, FREE_DICTS, GROUPS, OVERLAYS, asdict, compose, from_dictconfig,
                                      import_plugins, load_yaml, to_yaml)
from graft_cli.config.resolve import resolve
from graft_cli.config.validate import validate
from graft_cli.schema import Config, PolicyConfig, SourceConfig, samples_ahead

__all__ = ["EXPERIMENTS_DIR", "FREE_DICTS", "GROUPS", "OVERLAYS", "Config", "PolicyConfig", "SourceConfig", "asdict",
           "samples_ahead",
           "compose", "from_dictconfig", "import_plugins", "load_yaml", "resolve", "to_yaml", "validate"]
