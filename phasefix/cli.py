"""The command lines: each `python -m phasefix.<app>` is a Hydra app with its own primary config `conf/<app>.yaml`
over a typed schema (the one source of defaults), Hydra's help template (`hydra.help.template`) for `-h`, `--cfg`
for the composed config, `-v` for `verbose=true`, bad input as one line naming the key (exit code 2) and Ctrl-C as
exit code 130.

Configs are composed with Hydra's compose API (as the studies and the tests compose fit's), so every app is also a
function of its config: `fit(cfg)`, `report(cfg)`, `evaluate(cfg)`, ... `fit`, `report`, `study` and `theory` are
composed from the config directory (fit's groups model, data, trainer, ...). The tools `evaluate` and `analyze`
(SCHEMAS) are composed from Hydra's ConfigStore instead, because their own keys `model=` and `experiment=` would
otherwise select fit's config groups of the same name.

`run`'s `shim` lets an app keep the argument forms its users type (`python -m phasefix.study studies/x.yaml
--workers 2`, `report runs=a,b tag.K=V`, `evaluate model=~/m out=/tmp/x`) by rewriting them to overrides; `overrides`
is the tools' shim: plain `key=value` words, quoted where Hydra would misread them.
"""
from __future__ import annotations

import dataclasses
import difflib
import sys
import typing
from collections.abc import Callable, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from phasefix import config as C
from phasefix.errors import ConfigError
from phasefix.paths import CONF_DIR

SCHEMAS = {"evaluate": C.EvaluateConfig, "analyze": C.AnalyzeConfig,  # the tool apps and their typed schemas
           "ui": C.UiConfig}


def compose(overrides: Sequence[str] = (), config_name: str = "fit", hydra_config: bool = False) -> DictConfig:
    """The composed config of app `config_name` for these Hydra overrides (`hydra_config`: with the `hydra` node, for
    the help template); composition errors as ConfigError."""
    from hydra import compose as hydra_compose
    from hydra import initialize, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra

    for o in overrides if config_name == "fit" else ():
        key, _, value = o.lstrip("+~").partition("=")
        if key == "experiment":  # the group before conf/regime and conf/arm: Hydra would add it as a plain key
            regimes = sorted(p.stem for p in (CONF_DIR / "regime").glob("*.yaml"))
            raise ConfigError(f"experiment={value} is invalid: the presets are regimes now, regime=NAME (no +): "
                              f"allowed values are {', '.join(regimes)}; arms: arm=NAME (conf/arm)")
    GlobalHydra.instance().clear()
    try:
        if config_name in SCHEMAS:
            ConfigStore.instance().store(name=config_name, node=OmegaConf.load(CONF_DIR / f"{config_name}.yaml"))
            init = initialize(version_base="1.3", config_path=None)
        else:
            init = initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3")
        with init:
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides),
                                return_hydra_config=hydra_config or config_name == "fit")
    except Exception as e:  # Hydra/OmegaConf errors are long; users need one line naming the key
        raise ConfigError(one_line_error(e, overrides, config_name)) from None
    if config_name == "fit":
        record_choices(cfg)
        if not hydra_config:
            with open_dict(cfg):
                del cfg["hydra"]
    return cfg


LAYERED = ("regime", "recipe", "arm")  # fit's layered groups, in the order they merge (conf/fit.yaml)


def record_choices(cfg: DictConfig) -> None:
    """Write Hydra's runtime choices of fit's layered groups into the config (`regime`, `recipe`, `arm`): the run's
    MLflow tags and default name come from them, not from anything typed."""
    choices = cfg.hydra.runtime.choices
    for group in LAYERED:
        cfg[group] = choices.get(group)


def layering_note(cfg: DictConfig) -> str:
    """`--cfg`'s header for fit: the layered choices and the keys a later layer sets over an earlier one (the later
    wins: regime < recipe < arm < command line), each with the layer whose value the composed config holds (a regime
    built on another regime lists its own keys after its parent's recipe, so they win over it: docs/fit.md)."""
    from phasefix.tracking import flatten

    if not all(cfg.get(g) for g in LAYERED):
        return ""
    values = {}
    for group in LAYERED:
        node = OmegaConf.load(CONF_DIR / group / f"{cfg[group]}.yaml")
        values[group] = {k: v for k, v in flatten(OmegaConf.to_container(node)).items() if not k.startswith("defaults")}
    composed = flatten(OmegaConf.to_container(cfg, resolve=False))
    lines = [f"# regime={cfg.regime} recipe={cfg.recipe} arm={cfg.arm} (merged in this order; later wins)"]
    for i, low in enumerate(LAYERED):
        for high in LAYERED[i + 1:]:
            used = {}
            for k in sorted(values[low].keys() & values[high].keys()):
                winner = high if values[high][k] == composed.get(k) or values[low][k] != composed.get(k) else low
                used.setdefault(winner, []).append(k)
            for winner, ks in used.items():
                lines.append(f"# set by both {low}={cfg[low]} and {high}={cfg[high]}, {winner}'s value used: "
                             + ", ".join(ks))
    return "\n".join(lines) + "\n"


def one_line_error(e: Exception, overrides: Sequence[str], config_name: str) -> str:
    """A Hydra/OmegaConf composition error as one line naming the key (and its allowed values, or a close key)."""
    from hydra.errors import MissingConfigException

    if isinstance(e, MissingConfigException):
        for o in overrides:
            key, _, value = o.lstrip("+~").partition("=")
            group_dir = CONF_DIR / key
            if group_dir.is_dir():
                allowed = sorted(p.stem for p in group_dir.glob("*.yaml"))
                bad = [n for n in value.strip("[]").split(",") if n not in allowed]
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
    if first.startswith("Could not override '"):  # a key the app does not have
        return unknown_key(first.split("'")[1], config_name)
    return f"{first} (overrides: {' '.join(overrides)})"


def config_keys(config_name: str = "fit") -> list[str]:
    """Every key of the app's config, dotted (fit: both data kinds and every mitigation's options): what a misspelt
    key is matched against."""
    mitigations = sorted(p.stem for p in (CONF_DIR / "mitigation").glob("*.yaml"))
    variants = ([], ["data=lm_mix", f"+mitigation=[{','.join(mitigations)}]"]) if config_name == "fit" else ([],)
    keys = set()
    for overrides in variants:
        keys |= set(C.flatten(OmegaConf.to_container(compose(overrides, config_name), resolve=False)))
    return sorted(keys)


def unknown_key(key: str, config_name: str = "fit") -> str:
    """`unknown key K; did you mean K2?` (difflib over the app's keys)."""
    close = difflib.get_close_matches(key, config_keys(config_name), n=1, cutoff=0.6)
    lists = "--help" if config_name in SCHEMAS else "--cfg"  # a tool's help lists every key; fit's the most used
    return f"unknown key {key}" + (f"; did you mean {close[0]}?" if close
                                   else f" (python -m phasefix.{config_name} {lists} lists the keys)")


# ------------------------------------------------------------------------------------------------ key=value words
def quoted(value) -> str:
    """A string as a quoted Hydra override value (run ids such as 1e328003 stay strings, not floats; paths, `~/...`)."""
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def overrides(argv: Sequence[str], config_name: str, positional: str | None = None) -> list[str]:
    """A tool app's (SCHEMAS) words as Hydra overrides: a first word without `=` is `<positional>=word` (analyze's
    tool); values of string keys are quoted (paths, run ids, `~/...`), a comma list for a list key is a list
    (`padding=prefix,in_sequence`), and anything else Hydra cannot read as one value is quoted too."""
    types = typing.get_type_hints(SCHEMAS[config_name])
    out = []
    for i, arg in enumerate(argv):
        key, eq, value = arg.partition("=")
        if not eq:
            if i == 0 and positional is not None:
                out.append(_override(positional, arg, types.get(positional)))
                continue
            raise ConfigError(f"argument {arg!r} is invalid: expected key=value (python -m phasefix.{config_name} "
                              "--help lists the keys)")
        head = key.lstrip("+~").split(".", 1)[0]
        if "." in key and typing.get_origin(types.get(head)) is dict:  # an entry of a mapping option (tags.K=V)
            out.append(f"++{key.lstrip('+~')}={quoted(value)}")
            continue
        out.append(_override(key, value, types.get(key)))
    return out


def _override(key: str, value: str, kind) -> str:
    if key[:1] in "+~" or value[:1] in "[{'\"":  # Hydra's own syntax: as typed
        return f"{key}={value}"
    if typing.get_origin(kind) is list:
        return f"{key}=[{value}]"
    if kind is not None and str in typing.get_args(kind) + (kind,):
        return f"{key}={quoted(value)}"
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        if not OverridesParser.create().parse_override(f"{key}={value}").is_sweep_override():
            return f"{key}={value}"
    except Exception:  # not one Hydra value: a plain string
        pass
    return f"{key}={quoted(value)}"


def options(args, config_name: str, positional: str | None = None) -> DictConfig:
    """A tool app's config from a composed config, a mapping of options, or key=value words (the Python API)."""
    if isinstance(args, DictConfig):
        return args
    if isinstance(args, typing.Mapping):
        try:
            cfg = compose([], config_name)
            for k, v in args.items():  # a mapping option (tags) takes keys of its own
                if isinstance(v, typing.Mapping) and isinstance(cfg.get(k), DictConfig):
                    OmegaConf.set_struct(cfg[k], False)
            return OmegaConf.merge(cfg, dict(args))
        except Exception as e:
            raise ConfigError(one_line_error(e, [f"{k}={v}" for k, v in args.items()], config_name)) from None
    return compose(overrides(list(args), config_name, positional), config_name)


def sweep(words: Sequence[str]) -> list[list[str]]:
    """Hydra's multirun sweep (`-m seed=0,1,2 model.window=range(4,6)`): one override list per combination of the
    sweep overrides' values (every comma list, `range`, `choice`, ...), in the order Hydra's basic sweeper runs them."""
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(words))
    except Exception as e:
        raise ConfigError(f"{str(e).splitlines()[0]} (overrides: {' '.join(words)})") from None
    choices = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
               else [o.input_line] for o in parsed]
    return [list(job) for job in itertools.product(*choices)]


# ------------------------------------------------------------------------------------------------ help and run
def option_lines(config_name: str, tools: str | None = None) -> str:
    """`  key  help (default)` for every key of a tool app's schema (only those of `tools` when given)."""
    lines = []
    for f in dataclasses.fields(SCHEMAS[config_name]):
        meta = f.metadata
        if tools is not None and tools not in meta.get("tools", "").split(","):
            continue
        default = ",".join(f.default_factory()) if f.default_factory is not dataclasses.MISSING else f.default
        default = meta.get(tools, default) if tools else default
        shown = "" if default is None else f" ({str(default).lower() if isinstance(default, bool) else default})"
        lines.append(f"  {f.name:<13} {meta.get('help', '')}{shown}")
    return "\n".join(lines)


def help_text(config_name: str) -> str:
    """The app's `hydra.help.template` (conf/<app>.yaml) filled in: `$APP_CONFIG_GROUPS` with the config groups and
    their options; a tool app's `$OPTIONS` (`$OPTIONS_<tools>`: those of analyze's run or audit tools) with its keys."""
    template = compose([], config_name, hydra_config=True).hydra.help.template
    if "$APP_CONFIG_GROUPS" in template:
        groups = "\n".join(f"  {g.name:<11} " + ", ".join(sorted(p.stem for p in g.glob("*.yaml")))
                           for g in sorted(p for p in CONF_DIR.iterdir() if p.is_dir()))
        template = template.replace("$APP_CONFIG_GROUPS", groups)
    if config_name in SCHEMAS:
        for tools in ("run", "audit"):  # before $OPTIONS, its prefix
            template = template.replace(f"$OPTIONS_{tools}", option_lines(config_name, tools))
        template = template.replace("$OPTIONS", option_lines(config_name))
    return template


def verbose_flag(argv: list[str]) -> tuple[list[str], bool]:
    """(argv without -v/--verbose, whether it was given): `-v` is the short form of `verbose=true`."""
    rest = [a for a in argv if a not in ("-v", "--verbose")]
    return rest, len(rest) != len(argv)


def run(config_name: str, argv: Sequence[str] | None, work: Callable[[DictConfig], int],
        shim: Callable[[list[str]], list[str]] | None = None,
        check: Callable[[DictConfig], object] | None = None) -> int:
    """The CLI of app `config_name`: `-h`/`--help`, `-v`, `--cfg`, `-m`/`--multirun` (one `work` per combination of
    the sweep overrides, run one after another in this process), then `work(cfg)`'s exit code; ConfigError: one
    line on stderr, exit code 2; Ctrl-C (KeyboardInterrupt, its message saying how to resume): exit code 130.
    `shim` rewrites the app's own argument forms into overrides first; `check` validates every composed config
    before any work (the app's checks that need no torch: the app imports its heavy libraries in `work`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(help_text(config_name))
        return 0
    argv, verbose = verbose_flag(argv)
    show_cfg = "--cfg" in argv
    multirun = any(a in ("-m", "--multirun") for a in argv)
    argv = [a for a in argv if a not in ("--cfg", "-m", "--multirun")]
    try:
        words = (shim(argv) if shim else argv) + (["verbose=true"] if verbose else [])
        jobs = sweep(words) if multirun else [words]
        cfgs = [compose(job, config_name) for job in jobs]  # every job's config is checked before any work
        if show_cfg:
            print("\n---\n".join(layering_note(cfg) + OmegaConf.to_yaml(cfg) if config_name == "fit"
                                  else OmegaConf.to_yaml(cfg) for cfg in cfgs))
            return 0
        for cfg in cfgs if check else ():
            check(cfg)
        for i, (job, cfg) in enumerate(zip(jobs, cfgs)):
            if multirun:
                print(f"[multirun] job {i + 1} of {len(jobs)}: {' '.join(job)}", flush=True)
            rc = work(cfg)
            if rc:  # as Hydra's basic launcher: the sweep stops at the first failed job
                return rc
        return 0
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(str(e) or "interrupted", file=sys.stderr)
        return 130


__all__ = ["LAYERED", "SCHEMAS", "compose", "config_keys", "help_text", "layering_note", "one_line_error",
           "option_lines", "options", "overrides", "quoted", "run", "sweep", "unknown_key", "verbose_flag"]
