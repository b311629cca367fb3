"""A run config as text: the TOML file and the ``section.key=value`` overrides it is read from
(each key checked against its section's field as it is set), and the TOML it is written as
(``--print-config``, which :func:`spherenet.train.config.load_config` reads back unchanged)."""

from __future__ import annotations

import difflib
import json
import math
import sys
import typing
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

from .config_rules import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["parse_override", "read_toml", "set_key", "to_toml"]


def _sections(cfg) -> dict[str, Any]:
    """``{"model": cfg.model, "data": cfg.data, ...}``, in the config's order."""
    return {f.name: getattr(cfg, f.name) for f in fields(cfg)}


def _coerce(section: str, key: str, value: Any, default: Any) -> Any:
    """Check ``value`` against the type of the field's default; ints are accepted for floats."""
    where = f"{section}.{key}"
    if any("\x00" in v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)):
        raise ConfigError(f"{where} = {value!r} holds a NUL character, which no file system or name takes")
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    if isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # TOML reads nan and inf as floats
                raise ConfigError(f"{where} must be a finite number, got {value!r}")
            return float(value)
        raise ConfigError(f"{where} must be a number, got {value!r}")
    if isinstance(default, str):
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where} must be a string, got {value!r}")
    if isinstance(default, list):
        # An override that is not a TOML list arrives as text: "[a,b]", "a,b" or "a".
        if isinstance(value, str):
            value = [v.strip().strip("'\"") for v in value.strip().removeprefix("[").removesuffix("]").split(",")]
            value = [v for v in value if v]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(dict.fromkeys(value))  # duplicates dropped, order kept
        raise ConfigError(f"{where} must be a list of strings, got {value!r}")
    return value


def _set_model(overrides: dict[str, Any], key: str, value: Any) -> None:
    """Record ``[model] key = value``; checked against the model config when it is built
    (``ModelSection.build``).

    A table (``alpha_attn = {init = 0.1}``) is merged key by key into what is set already, like
    the dotted key ``alpha_attn.init``."""
    if "." in key:  # model.alpha_attn.init=0.1 (parse_override allows one level)
        key, sub = key.split(".", 1)
        value = {sub: value}
    if isinstance(value, dict):
        table = overrides.get(key)
        overrides[key] = {**(table if isinstance(table, dict) else {}), **value}
    else:
        overrides[key] = value


def set_key(cfg, section: str, key: str, value: Any) -> None:
    """Set ``section.key`` of ``cfg`` (a ``RunConfig``) to ``value``, checked against the field's type."""
    sections = _sections(cfg)
    if section not in sections:
        raise ConfigError(
            f"unknown config section [{section}]{_did_you_mean(cfg, section, sections)} (valid: {', '.join(sections)})"
        )
    obj = sections[section]
    if section == "model" and key != "preset":
        _set_model(obj.overrides, key, value)
        return
    names = {f.name: f for f in fields(obj) if f.name != "overrides"}
    if key not in names:
        raise ConfigError(
            f"unknown config key {section}.{key}{_did_you_mean(cfg, key, names, section)} "
            f"(valid keys of [{section}]: {', '.join(names)})"
        )
    like = getattr(obj, key)
    if like is None:  # an unset key: checked against its declared type (``float | None``: a float)
        like = next(t for t in typing.get_args(typing.get_type_hints(type(obj))[key]) if t is not type(None))()
    setattr(obj, key, _coerce(section, key, value, like))


def _did_you_mean(cfg, word: str, choices, section: str | None = None) -> str:
    """``"; did you mean optim.lr?"`` for the closest of ``choices``, or "" when none is close. A
    key of another section is named with its section (``lr`` given under [train]: optim.lr)."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {section + '.' if section else ''}{close[0]}?"
    if section is not None:
        for other, obj in _sections(cfg).items():
            if other != section and word in {f.name for f in fields(obj)} - {"overrides"}:
                return f"; did you mean {other}.{word}?"
    return ""


def to_toml(cfg) -> str:
    """``cfg`` as a TOML file that :func:`spherenet.train.config.load_config` reads back into the
    same config; an unset (``None``) key, in a section or in a table, is left out."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v) if not isinstance(v, float) or math.isfinite(v) else ("inf" if v > 0 else "-inf")
        if isinstance(v, str):
            return json.dumps(v)  # a TOML basic string is a JSON string
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items() if x is not None) + " }"
        raise TypeError(f"cannot write {v!r} as TOML")

    lines = []
    for section, table in cfg.to_dict().items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {value(v)}" for key, v in table.items() if v is not None)
        if section == "model" and "vocab_size" not in table:
            lines.append("# vocab_size: the data's (data.tokenizer's vocabulary) unless set here")
        lines.append("")
    return "\n".join(lines)


def parse_override(text: str) -> tuple[str, str, Any]:
    """``"optim.lr=1e-3"`` -> ``("optim", "lr", 0.001)``; the value is read as a TOML value,
    falling back to a plain string (so ``data.source=my.txt`` needs no quotes; a list key also
    takes ``[a,b]`` or ``a,b`` unquoted). A field of a model scaling is
    ``model.alpha_attn.init=0.1`` -> ``("model", "alpha_attn.init", 0.1)``."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form section.key=value")
    dotted, raw = text.split("=", 1)
    parts = [part.strip() for part in dotted.split(".")]
    if not (len(parts) == 2 or (len(parts) == 3 and parts[0] == "model")) or not all(parts):
        raise ConfigError(f"override key {dotted!r} must be section.key (e.g. optim.lr, model.alpha_attn.init)")
    section, key = parts[0], ".".join(parts[1:])
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return section, key, value


def read_toml(path: str | Path) -> Iterator[tuple[str, str, Any]]:
    """The ``(section, key, value)`` settings of a TOML config file, in the file's order (a
    top-level key that is no table is refused when reached, after the settings before it)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    for section, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: top-level key {section!r} must be a [section] table")
        for key, value in table.items():
            yield section, key, value
