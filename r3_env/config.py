"""Typed configs from dataclasses: CLI flags (OpenRLHF's dotted style) and YAML files.

A dataclass field ``seed`` of a config added with prefix ``world.`` becomes ``--world.seed``;
a field without a prefix becomes ``--seed``. Underscores may be written as dashes too
(``--train-questions``). A YAML file (``--config FILE``) gives defaults that flags override;
unknown keys and wrong types are errors that name the key and the fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value or key is invalid; the message names it and the fix."""


def _field_type(cls: type, field: dataclasses.Field) -> tuple[type, bool]:
    """(base type, optional) of a dataclass field, resolving string annotations."""
    hint = typing.get_type_hints(cls)[field.name]
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        hint = args[0]
    return hint, optional


def _convert(cls: type, field: dataclasses.Field, value: Any, where: str) -> Any:
    base, optional = _field_type(cls, field)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}: {field.name} may not be null")
    if typing.get_origin(base) is dict or base is dict:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ConfigError(f"{where}: {field.name} must be a JSON object, got {value!r}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {field.name} must be a mapping, got {value!r}")
        return value
    if typing.get_origin(base) is typing.Literal:
        choices = typing.get_args(base)
        if value not in choices:
            raise ConfigError(f"{where}: {field.name} must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    try:
        if base is bool:
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(value)
                return value.lower() in ("true", "1", "yes")
            return bool(value)
        if base in (int, float, str):
            if base is not str and isinstance(value, bool):  # YAML's true/false are not numbers
                raise ValueError(value)
            if base is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return base(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {field.name} must be {base.__name__}, got {value!r}") from None
    return value


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type, prefix: str = "") -> None:
    """Add one flag per field of dataclass ``cls``; help text comes from ``field.metadata['help']``."""
    group = parser.add_argument_group(prefix.rstrip(".") or cls.__name__)
    for field in dataclasses.fields(cls):
        base, _ = _field_type(cls, field)
        names = [f"--{prefix}{field.name}"]
        if "_" in field.name:
            names.append(f"--{prefix}{field.name.replace('_', '-')}")
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default
        kwargs: dict[str, Any] = {
            "dest": f"{prefix}{field.name}",
            "default": None,
            "help": f"{field.metadata.get('help', '')} (default: {default!r})",
        }
        if base is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(base) is typing.Literal:
            kwargs["choices"] = typing.get_args(base)
        else:
            kwargs["type"] = base if base in (int, float, str) else str
            kwargs["metavar"] = base.__name__.upper() if base in (int, float, str) else "VALUE"
        group.add_argument(*names, **kwargs)


def build_config(
    cls: type[T],
    args: argparse.Namespace | None = None,
    prefix: str = "",
    file_values: dict[str, Any] | None = None,
    where: str = "config",
) -> T:
    """An instance of ``cls``: defaults, then ``file_values``, then flags that were given."""
    names = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in (file_values or {}).items():
        if key not in names:
            raise ConfigError(f"{where}: unknown key {key!r}; valid keys: {', '.join(sorted(names))}")
        values[key] = _convert(cls, names[key], value, where)
    if args is not None:
        for name, field in names.items():
            value = getattr(args, f"{prefix}{name}", None)
            if value is not None:
                values[name] = _convert(cls, field, value, f"--{prefix}{name}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{where}: {error}") from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values")
    return data


def positive_ints(value: str, name: str) -> list[int]:
    """The distinct whole numbers >= 1 of a comma-separated option, sorted (ConfigError naming ``name`` if not)."""
    try:
        values = sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError:
        raise ConfigError(f"{name} must be whole numbers separated by commas, got {value!r}") from None
    if not values or values[0] < 1:
        raise ConfigError(f"{name} must be 1 or more, got {value!r}")
    return values


def configs_from_args(
    args: argparse.Namespace, sections: list[tuple[str, type]], ignored: frozenset[str] = frozenset()
) -> list[Any]:
    """One config per (prefix, class), from ``--config FILE`` (when given) overridden by flags.

    Prefix "" takes the file's top-level keys; prefix "name." takes the mapping under ``name:``.
    Top-level keys in ``ignored`` (another tool's settings that do not apply) are dropped with a note.
    """
    path = getattr(args, "config", None)
    values = load_yaml(path) if path else {}
    skipped = sorted(set(values) & ignored)
    if skipped:
        logging.getLogger(__name__).info("%s: ignoring %s (not used by r3rag)", path, ", ".join(skipped))
        values = {key: value for key, value in values.items() if key not in ignored}
    return configs_from_values(values, sections, args, where=path or "invalid option")


def configs_from_values(
    values: dict[str, Any],
    sections: list[tuple[str, type]],
    args: argparse.Namespace | None = None,
    where: str = "config",
) -> list[Any]:
    """One config per (prefix, class) from a mapping of sections (and flags in ``args``, which win)."""
    nested = {prefix.rstrip("."): cls for prefix, cls in sections if prefix}
    allowed = set(nested) | {f.name for prefix, cls in sections if not prefix for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; valid keys: {', '.join(sorted(allowed))}")
    configs = []
    for prefix, cls in sections:
        name = prefix.rstrip(".")
        if prefix:
            section = {} if values.get(name) is None else values[name]
            if not isinstance(section, dict):
                raise ConfigError(f"{where}: '{name}' must be a mapping of {name} settings")
            section_where = f"{where} ({name})"
        else:
            section = {key: value for key, value in values.items() if key not in nested}
            section_where = where
        configs.append(build_config(cls, args, prefix=prefix, file_values=section, where=section_where))
    return configs


def add_config_command(
    subparsers: argparse._SubParsersAction,
    name: str,
    sections: list[tuple[str, type]],
    func,
    help: str,
    description: str = "",
) -> argparse.ArgumentParser:
    """A subcommand configured by ``--config FILE`` and one flag per field of each (prefix, class) section."""
    parser = subparsers.add_parser(name, help=help, description=description or help)
    parser.add_argument("--config", help="YAML file of the settings below; flags override it")
    for prefix, cls in sections:
        add_dataclass_arguments(parser, cls, prefix)
    parser.set_defaults(func=func)
    return parser
