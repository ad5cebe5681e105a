"""The command lines: each `python -m phasefix.<app>` is a Hydra app with its own primary config `conf/<app>.yaml`
over a typed schema (the one source of defaults), Hydra's help template (`hydra.help.template`) for `-h`, `--cfg`
for the composed config, `-v` for `verbose=true`, and bad input as one line naming the key, exit code 2.

Configs are composed with Hydra's compose API (as the studies and the tests compose fit's), so every app is also a
function of its config: `fit(cfg)`, `report(cfg)`, ... `shim` lets an app keep the argument forms its users type
(`python -m phasefix.study studies/x.yaml --workers 2`, `report runs=a,b tag.K=V`) by rewriting them to overrides.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from omegaconf import DictConfig, OmegaConf

from phasefix.errors import ConfigError
from phasefix.paths import CONF_DIR


def compose(overrides: Sequence[str] = (), config_name: str = "fit") -> DictConfig:
    """The composed config for these overrides (Hydra compose API), with composition errors as ConfigError."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name=config_name, overrides=list(overrides))
    except Exception as e:  # Hydra/OmegaConf errors are long; users need one line naming the key
        raise ConfigError(_one_line_hydra_error(e, overrides, config_name)) from None


def _one_line_hydra_error(e: Exception, overrides: Sequence[str], config_name: str) -> str:
    from hydra.errors import MissingConfigException

    if isinstance(e, MissingConfigException):
        for o in overrides:
            key, _, value = o.lstrip("+~").partition("=")
            group_dir = CONF_DIR / key
            if group_dir.is_dir():
                allowed = sorted(p.stem for p in group_dir.glob("*.yaml"))
                names = value.strip("[]").split(",")
                bad = [n for n in names if n not in allowed]
                if bad:
                    return f"{key}={bad[0]} is invalid: allowed values are {', '.join(allowed)}"
    cause = e.__cause__ or e
    msg = str(cause).splitlines()
    full_key = next((ln.split(":", 1)[1].strip() for ln in msg if ln.strip().startswith("full_key:")), None)
    first = msg[0] if msg else type(e).__name__
    if full_key and ("not in" in first or "is not in struct" in first):
        return unknown_key(full_key, config_name)
    if full_key:
        return f"{full_key}: {first}"
    return f"{first} (overrides: {' '.join(overrides)})"


def config_keys(config_name: str = "fit") -> list[str]:
    """Every key of an app's config, dotted (fit: both data kinds): what a misspelt key is matched against."""
    from phasefix.tracking import flatten

    keys = set()
    for overrides in ([], ["data=lm_mix"]) if config_name == "fit" else ([],):
        keys |= set(flatten(OmegaConf.to_container(compose(overrides, config_name), resolve=False)))
    return sorted(keys)


def unknown_key(key: str, config_name: str = "fit") -> str:
    """`unknown key K; did you mean K2?` (difflib over the app's keys)."""
    import difflib

    close = difflib.get_close_matches(key, config_keys(config_name), n=1, cutoff=0.6)
    return f"unknown key {key}" + (f"; did you mean {close[0]}?" if close
                                   else f" (python -m phasefix.{config_name} --cfg lists the keys)")


def help_text(config_name: str) -> str:
    """The app's `hydra.help.template`, `$APP_CONFIG_GROUPS` filled with the config groups and their options."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, return_hydra_config=True)
    groups = "\n".join(f"  {g.name:<11} " + ", ".join(sorted(p.stem for p in g.glob("*.yaml")))
                       for g in sorted(p for p in CONF_DIR.iterdir() if p.is_dir()))
    return cfg.hydra.help.template.replace("$APP_CONFIG_GROUPS", groups)


def quoted(value: str) -> str:
    """A string as a quoted Hydra override value (run ids such as 1e328003 stay strings, not floats)."""
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def run(config_name: str, argv: Sequence[str] | None, work: Callable[[DictConfig], int],
        shim: Callable[[list[str]], list[str]] | None = None) -> int:
    """The CLI of app `config_name`: `-h`/`--help`, `-v`, `--cfg`, then `work(cfg)`'s exit code; ConfigError: one
    line on stderr, exit code 2. `shim` rewrites the app's own argument forms into overrides first."""
    from phasefix.console import verbose_flag

    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(help_text(config_name))
        return 0
    argv, verbose = verbose_flag(argv)
    show_cfg = "--cfg" in argv
    argv = [a for a in argv if a != "--cfg"]
    try:
        overrides = shim(argv) if shim else argv
        cfg = compose(overrides + (["verbose=true"] if verbose else []), config_name)
        if show_cfg:
            print(OmegaConf.to_yaml(cfg))
            return 0
        return work(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


__all__ = ["compose", "config_keys", "help_text", "quoted", "run", "unknown_key"]
