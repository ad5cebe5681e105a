"""A study's search space: its params (`Param`, parsed from the study file's `params:`: a value's overrides, the
mitigations a mitigation-set param enables, what a param requires) and the mitigations the base enables; the study
file walks them as a trial does (`spec.sampled_params`)."""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from phasefix.errors import check, check_choice, check_known_keys, check_number

PARAM_KEYS = ("choices", "high", "log", "low", "override", "requires", "step", "type")
PARAM_TYPES = ("categorical", "int", "float", "logfloat")
NONE_CHOICES = ("none", "null", "", None)


@dataclass
class Param:
    name: str
    type: str
    override: str | None = None            # the config key this param sets (None: choices are override lists)
    choices: list = field(default_factory=list)               # categorical: the values Optuna sees (str/num)
    choice_overrides: dict = field(default_factory=dict)      # categorical: value -> list of overrides
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    requires: tuple[str, ...] = ()         # mitigations that must be enabled for this param to be sampled

    @property
    def sets_mitigations(self) -> bool:
        return self.override is not None and self.override.lstrip("+") == "mitigation"

    def overrides(self, value) -> list[str]:
        if self.type == "categorical":
            return list(self.choice_overrides[value])
        return [f"{self.override}={value!r}" if isinstance(value, float) else f"{self.override}={value}"]

    def mitigations(self, value) -> set[str]:
        return set() if value in NONE_CHOICES else set(str(value).split("+"))


def _choice_name(c) -> str | int | float | bool | None:
    """A categorical choice as Optuna stores it: lists (mitigation sets) become 'a+b', [] becomes 'none'."""
    if isinstance(c, (list, tuple)):
        return "+".join(str(x) for x in c) if c else "none"
    return c


def _hydra_value(v) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def parse_param(name: str, d, where: str) -> Param:
    key = f"{where}.{name}"
    check(isinstance(d, dict), key, d, "must be a mapping with a 'type'")
    check_known_keys(d, PARAM_KEYS, key, "a param key")
    check_choice(f"{key}.type", d.get("type"), PARAM_TYPES)
    p = Param(name=name, type=d["type"], override=d.get("override"))
    if p.override is not None:
        check(isinstance(p.override, str) and re.fullmatch(r"[+~]?[A-Za-z_][\w.]*", p.override) is not None,
              f"{key}.override", p.override, "must be a config key such as optim.lr or +mitigation")
    if p.type == "categorical":
        choices = d.get("choices")
        check(isinstance(choices, (list, dict)) and len(choices) > 0, f"{key}.choices", choices,
              "must be a non-empty list (or a mapping name -> list of overrides)")
        if isinstance(choices, dict):  # named bundles of overrides, e.g. W8S8: [model.window=8, model.stride=8]
            check(p.override is None, f"{key}.override", p.override,
                  "must be absent when choices map names to override lists")
            for cname, ovs in choices.items():
                ovs = [] if ovs is None else ovs
                check(isinstance(ovs, list) and all(isinstance(o, str) and "=" in o for o in ovs),
                      f"{key}.choices.{cname}", ovs, "must be a list of key=value overrides")
                p.choices.append(str(cname))
                p.choice_overrides[str(cname)] = list(ovs)
        else:
            check(p.override is not None, f"{key}.override", None,
                  "is required for a list of choices (the config key the choice sets)")
            for c in choices:
                check(c is None or isinstance(c, (str, int, float, bool, list)), f"{key}.choices", c,
                      "must be a string, number, boolean, null or a list of names")
                value = _choice_name(c)
                check(value not in p.choices, f"{key}.choices", c, "appears twice")
                p.choices.append(value)
                if p.sets_mitigations:
                    names = [] if value in NONE_CHOICES else str(value).split("+")
                    p.choice_overrides[value] = [f"+mitigation=[{','.join(names)}]"] if names else []
                elif p.override.startswith("+") and value in NONE_CHOICES:  # an optional group left out
                    p.choice_overrides[value] = []
                elif isinstance(c, list):
                    p.choice_overrides[value] = [f"{p.override}=[{','.join(map(_hydra_value, c))}]"]
                else:
                    p.choice_overrides[value] = [f"{p.override}={_hydra_value(c)}"]
    else:
        check(p.override is not None, f"{key}.override", None, "is required (the config key the param sets)")
        check(not p.override.startswith(("+", "~")) or p.override.startswith("+"), f"{key}.override", p.override,
              "cannot delete a key")
        kind = int if p.type == "int" else float
        p.low = check_number(f"{key}.low", d.get("low"), kind)
        p.high = check_number(f"{key}.high", d.get("high"), kind)
        check(p.low <= p.high, f"{key}.high", p.high, f"must be >= low ({p.low})")
        p.log = bool(d.get("log", False)) or p.type == "logfloat"
        if p.type == "logfloat":
            p.type = "float"
        if d.get("step") is not None:
            p.step = check_number(f"{key}.step", d["step"], kind)
            check(p.step > 0, f"{key}.step", p.step, "must be > 0")
            check(not p.log, f"{key}.step", p.step, "cannot be combined with log: true")
        if p.log:
            check(p.low > 0, f"{key}.low", p.low, "must be > 0 with a log scale")
    requires = d.get("requires")
    if requires is None and p.override and p.override.lstrip("+").startswith("mitigation."):
        parts = p.override.lstrip("+").split(".")
        requires = [parts[1]] if len(parts) > 2 else None  # mitigation.<name>.<key>: only when <name> is on
    if requires is not None:
        requires = [requires] if isinstance(requires, str) else requires
        check(isinstance(requires, list) and all(isinstance(r, str) for r in requires), f"{key}.requires",
              requires, "must be a mitigation name or a list of them")
        p.requires = tuple(requires)
    return p


def parse_params(raw, base: list[str]) -> list[Param]:
    raw = raw or {}
    check(isinstance(raw, dict), "params", raw, "must be a mapping name -> {type, ...}")
    params = [parse_param(str(n), d, "params") for n, d in raw.items()]
    mit = [p for p in params if p.sets_mitigations]
    check(len(mit) <= 1, "params", [p.name for p in mit], "at most one param may choose the mitigation set")
    base_mit = [o for o in base if o.lstrip("+").startswith("mitigation=")]
    if mit:
        check(not base_mit, "base", base_mit[0] if base_mit else None,
              f"sets the mitigations that params.{mit[0].name} chooses")
    params.sort(key=lambda p: not p.sets_mitigations)  # the mitigation set first: weights depend on it
    possible = base_mitigations(base) | {m for pm in mit for c in pm.choices for m in pm.mitigations(c)}
    for p in params:  # a weight of a mitigation that is never enabled is a typo
        for r in p.requires:
            check(r in possible, f"params.{p.name}.requires", r,
                  f"mitigation {r!r} is never enabled (base or a mitigation-set param)")
    return params


def base_mitigations(base: Sequence[str]) -> set[str]:
    """The mitigations the base overrides enable (`+mitigation=[a,b]`)."""
    for o in base:
        k, _, v = o.lstrip("+").partition("=")
        if k == "mitigation":
            return {n.strip() for n in v.strip("[]").split(",") if n.strip()}
    return set()
