"""Composition: the Hydra tree in ``experiments/`` (``config.yaml`` + ``pair/*.yaml`` +
``method/*.yaml`` + overlays + command-line overrides) merged into the schema's dataclasses
(:mod:`graft_cli.schema`), so an unknown key fails with the key's name; then resolved
(:mod:`graft_cli.config.resolve`) and validated (:mod:`graft_cli.config.validate`). Every failure is
one line naming the key. """

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from graft_cli.config.resolve import resolve
from graft_cli.config.validate import validate
from graft_cli.errors import GraftError
from graft_cli.schema import Config, PolicyConfig, SourceConfig


def _scaled(x, f) -> int:
    """``${graft_scale:${data.prompt_batch},0.5}``: an int scaled from another key (a method's
    minibatch as a share of the pair's prompt batch)."""
    return max(1, int(round(int(x) * float(f))))


OmegaConf.register_new_resolver("graft_scale", _scaled, replace=True)

EXPERIMENTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                               "experiments")


def _one_line(e: Exception) -> str:
    msg = str(e).strip().splitlines()
    key = getattr(e, "full_key", None)
    head = msg[0] if msg else type(e).__name__
    return f"config key {key!r}: {head}" if key else f"config: {head}"


# scale=<name>: an optional hardware overlay (experiments/scale/); task=<name>: an optional task
# overlay (experiments/task/: another task's data, reward, prompt, student and teacher for the
# pair); both applied last
GROUPS = ("pair", "method", "scale", "task")
OVERLAYS = ("scale", "task")


def compose(overrides: list[str] | None = None, config_dir: str | None = None) -> Config:
    """Compose ``config.yaml`` with Hydra (config groups ``pair=`` and ``method=`` select files),
    merge into the schema, apply the ``key=value`` overrides, resolve, validate. Raises
    :class:`GraftError` with one line on any problem (an unknown key names the key)."""
    # lazy: Hydra only composes configs
    from hydra import compose as hcompose

    # lazy: Hydra only composes configs
    from hydra import initialize_config_dir

    # lazy: Hydra only composes configs
    from hydra.core.global_hydra import GlobalHydra

    # lazy: Hydra only composes configs
    from hydra.errors import HydraException

    config_dir = config_dir or EXPERIMENTS_DIR
    groups, rest = [], []
    for ov in overrides or []:
        key, eq, val = ov.partition("=")
        if not eq:
            raise GraftError(f"override {ov!r}: expected key=value")
        if key in GROUPS:
            val = val.strip("'\"")
            if not os.path.exists(os.path.join(config_dir, key, f"{val}.yaml")):
                known = sorted(f[:-5] for f in os.listdir(os.path.join(config_dir, key))
                               if f.endswith(".yaml") and not f.startswith("_"))
                raise GraftError(f"{key} {val!r}: no {key}/{val}.yaml in {config_dir}; known: {', '.join(known)}")
            groups.append(f"{'+' if key in OVERLAYS else ''}{key}='{val}'")
        else:
            rest.append(ov)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            raw = hcompose(config_name="config", overrides=groups)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise GraftError(f"config: {str(e).strip().splitlines()[0]}") from None
    return from_dictconfig(raw, rest)


def from_dictconfig(raw: DictConfig | dict, overrides: list[str] | None = None, load_plugins: bool = True) -> Config:
    """Merge into the schema, apply overrides, import plugins (``load_plugins``), resolve, validate.
    A config read back from a run directory (:func:`load_yaml`) imports no plugin: code runs only
    when the user names it."""

    schema = OmegaConf.structured(Config)
    try:
        merged = OmegaConf.merge(schema, raw)
        for path in FREE_DICTS:
            OmegaConf.set_struct(OmegaConf.select(merged, path), False)

        def apply(ovs):
            for ov in ovs:
                key, _, val = ov.partition("=")
                key = key.lstrip("+")
                try:
                    value = yaml.safe_load(val) if val != "" else ""
                except yaml.YAMLError:
                    value = val
                if OmegaConf.select(merged, key, default="__missing__") == "__missing__" and not _dict_field(merged,
                                                                                                         key):
                    raise GraftError(f"config key {key!r}: unknown key")
                OmegaConf.update(merged, key, value, merge=True)

        # overrides of other keys first: the model lists may interpolate them (e.g.
        # ${distill.student})
        lists = [ov for ov in overrides or [] if ov.lstrip("+").split("=")[0].split(".")[0] in ("policies", "sources")]
        apply([ov for ov in overrides or [] if ov not in lists])
        merged.policies = [OmegaConf.merge(OmegaConf.structured(PolicyConfig), p) for p in merged.policies]
        merged.sources = [OmegaConf.merge(OmegaConf.structured(SourceConfig), p) for p in merged.sources]
        for ov in lists:  # a list given whole holds plain mappings: into the schema (nested sections typed) at once,
            apply([ov])  # so a later override may set their keys (policies=[...] +policies.0.lora.r=8)
            merged.policies = [OmegaConf.merge(OmegaConf.structured(PolicyConfig), p) if isinstance(p, DictConfig)
                               else p for p in merged.policies]
        cfg: Config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise GraftError(_one_line(e)) from None
    for key in ("policies", "sources"):
        for i, p in enumerate(getattr(cfg, key)):
            if not isinstance(p, (PolicyConfig, SourceConfig, dict)):
                raise GraftError(f"config key '{key}.{i}': must be a mapping like {{name: a, model: PATH}}, got {p!r}")
    cfg.policies = [p if isinstance(p, PolicyConfig) else PolicyConfig(**p) for p in cfg.policies]
    cfg.sources = [p if isinstance(p, SourceConfig) else SourceConfig(**p) for p in cfg.sources]
    if load_plugins:
        import_plugins(cfg.plugins)
    resolve(cfg)
    validate(cfg, registries=load_plugins)
    return cfg


def import_plugins(plugins: list) -> None:
    """Import each plugin (a module name, or a path to a ``.py`` file) so that its registered
    functions exist before the config is validated: how a new method is added without editing
    graft."""

    for i, name in enumerate(plugins or []):
        name = str(name)
        try:
            if name.endswith(".py"):
                mod = f"graft_plugin_{os.path.splitext(os.path.basename(name))[0]}"
                if mod in sys.modules:
                    continue
                spec = importlib.util.spec_from_file_location(mod, name)
                if spec is None or not os.path.exists(name):
                    raise FileNotFoundError(name)
                module = importlib.util.module_from_spec(spec)
                sys.modules[mod] = module
                spec.loader.exec_module(module)
            else:
                importlib.import_module(name)
        except GraftError:
            raise
        except Exception as e:
            raise GraftError(f"config key 'plugins.{i}': cannot import {name!r}: {type(e).__name__}: {e}") from None


def _dict_field(cfg: DictConfig, key: str) -> bool:
    """True when ``key`` adds an entry under a free-form dict field (``exchange.params.x``,
    ``extra.y``)."""
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    return parent in FREE_DICTS or any(parent.startswith(p + ".") for p in FREE_DICTS)


FREE_DICTS = ("exchange.params", "extra", "data.fields", "data.where", "data.mix", "rollout.engine_kwargs",
              "algo.loss_params", "algo.token_adv_params", "algo.loss_mask_params", "algo.rollout_correction.params",
              "distill", "tandem", "eval.final.bench_runs")


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def load_yaml(path: str) -> Config:
    try:
        raw = OmegaConf.load(path)
    except Exception as e:
        raise GraftError(f"{path}: {str(e).splitlines()[0]}") from None
    return from_dictconfig(raw, load_plugins=False)


def asdict(cfg: Config) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
