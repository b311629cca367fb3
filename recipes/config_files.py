"""The config files of ``recipes.train``: the shipped ones in ``recipes/configs/`` and how
``--config`` finds one, by path or by name from any directory."""

from __future__ import annotations

from pathlib import Path

from spherenet.train.config import ConfigError

__all__ = ["CONFIGS_DIR", "DEFAULT_CONFIG", "resolve_config", "shipped_configs"]

CONFIGS_DIR = Path(__file__).parent / "configs"
DEFAULT_CONFIG = CONFIGS_DIR / "default.toml"


def shipped_configs() -> list[str]:
    """The names of the configs that ship with spherenet (``--config NAME`` finds them anywhere)."""
    return sorted(p.stem for p in CONFIGS_DIR.glob("*.toml"))


def resolve_config(name: str | None) -> Path:
    """The config file ``--config`` names: a path, or the name of a shipped config (``ngpt-tiny``
    or ``ngpt-tiny.toml``) from any directory. ``ConfigError`` lists the shipped ones."""
    if name is None:
        return DEFAULT_CONFIG
    path = Path(name).expanduser()
    if path.is_file():
        return path
    shipped = CONFIGS_DIR / (path.name if path.suffix == ".toml" else f"{path.name}.toml")
    if path.parent != Path("."):
        raise ConfigError(f"config file not found: {path}")
    if shipped.is_file():
        return shipped
    raise ConfigError(
        f"--config {name}: no such file, and no shipped config of that name ({', '.join(shipped_configs())})"
    )
