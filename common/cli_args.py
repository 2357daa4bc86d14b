"""Command-line flags generated from a config dataclass, so each component has one source of truth."""
from __future__ import annotations

import argparse
import dataclasses
import types
import typing


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type, exclude: tuple[str, ...] = ()) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init or f.name in exclude:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = _base_type(hints[f.name])
        default = None if f.default is dataclasses.MISSING else f.default
        help_text = f.metadata.get("help", "")
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        else:
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            parser.add_argument(flag, type=f.metadata.get("parse", kind), default=default, required=required,
                                help=help_text + (f" (default: {default})" if default is not None else ""))


def dataclass_from_args(cls: type, args: argparse.Namespace, exclude: tuple[str, ...] = (), **overrides):
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
              if f.init and f.name not in exclude and hasattr(args, f.name)}
    values.update(overrides)
    return cls(**values)


def _base_type(hint: object) -> type:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint  # type: ignore[return-value]
