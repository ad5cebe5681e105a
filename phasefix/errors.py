"""The one error type for bad user input: a single line naming the key and what is allowed."""


class ConfigError(ValueError):
    """Invalid configuration value. The message names the key and the allowed values."""


def check_choice(key: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is invalid: allowed values are {', '.join(repr(a) for a in allowed)}")


def check(cond: bool, key: str, value, rule: str) -> None:
    if not cond:
        raise ConfigError(f"{key}={value!r} is invalid: {rule}")


def check_all(*checks) -> None:
    """Run every check (a callable raising ConfigError); one ConfigError with every failure, in the order given, so
    a user who got two things wrong reads both, the first one typed first."""
    failed = []
    for c in checks:
        try:
            c()
        except ConfigError as e:
            failed.append(str(e))
    if failed:
        raise ConfigError("; ".join(failed))


def check_number(key: str, v, kind=float):
    """`v` as a float (`kind=int`: an int), or one line saying it must be a number (an integer)."""
    if isinstance(v, str):  # YAML reads 1e-3 (no dot) as a string
        try:
            v = float(v)
        except ValueError:
            pass
    check(isinstance(v, (int, float)) and not isinstance(v, bool), key, v, "must be a number")
    if kind is int:
        check(float(v).is_integer(), key, v, "must be an integer")
        return int(v)
    return float(v)


def check_known_keys(d: dict, allowed, where: str, what: str) -> None:
    """One line naming the first unknown key of the mapping at `where` and the allowed ones."""
    unknown = sorted((k for k in d if k not in allowed), key=str)
    if unknown:
        key = f"{where}.{unknown[0]}" if where else unknown[0]
        check(False, key, d[unknown[0]], f"is not {what}: allowed keys are {', '.join(allowed)}")


def check_group_keys(group: str, keys, known) -> None:
    """One line naming the first of `keys` that config group `group` has no field for, and the fields it has."""
    unknown = sorted(set(keys) - set(known))
    if unknown:
        raise ConfigError(f"{group}.{unknown[0]} is not a {group} key: allowed keys are {', '.join(sorted(known))}")
