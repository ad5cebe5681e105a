"""Absolute paths derived from the project root, so runs started from any directory land in the same places."""
import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = PROJECT_ROOT / "conf"
MLRUNS_DIR = PROJECT_ROOT / "mlruns"
OUTPUTS_DIR = PROJECT_ROOT / "outputs"


def project_path(path: str | Path) -> Path:
    """A path as the comparison files write it (relative to the project root, or absolute), made absolute."""
    path = Path(path)
    return path if path.is_absolute() else PROJECT_ROOT / path


def default_tracking_uri() -> str:
    return f"sqlite:///{MLRUNS_DIR / 'mlflow.db'}"


def cache_dir() -> Path:
    """What phasefix keeps between runs (built datasets, inductor's compiled graphs): $PHASEFIX_CACHE, else
    ~/.cache/phasefix."""
    return Path(os.environ.get("PHASEFIX_CACHE") or Path.home() / ".cache" / "phasefix")
