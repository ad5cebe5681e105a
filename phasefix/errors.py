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
