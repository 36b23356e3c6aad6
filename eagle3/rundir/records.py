"""The run dir's JSON files as dataclasses: a record read from a parsed JSON object with its fields' types
checked, written back as JSON whole or not at all."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from eagle3 import safe_write
from eagle3.errors import ConfigError

R = TypeVar("R")


def _matches(value: Any, hint: Any) -> bool:
    """Whether a parsed JSON value has the type a record's field declares (containers: their own type only)."""
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        return isinstance(value, list) and all(_matches(v, args[0]) for v in value)
    return isinstance(value, origin or hint)


def record_from_dict(cls: type[R], plain: Any) -> R:
    """The record of type `cls` a parsed JSON file holds; ValueError saying what is missing or mistyped."""
    if not isinstance(plain, dict):
        raise ValueError(f"not a JSON object but {type(plain).__name__}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in plain:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"no {f.name!r}")
            continue
        if not _matches(plain[f.name], hints[f.name]):
            raise ValueError(f"{f.name!r} is {plain[f.name]!r}, not of type {hints[f.name]}")
        kwargs[f.name] = plain[f.name]
    return cls(**kwargs)


def record_to_dict(record: Any, omit_none: tuple[str, ...] = ()) -> dict[str, Any]:
    """The record's fields as JSON keys; those named in `omit_none` only when they hold a value."""
    return {k: v for k, v in dataclasses.asdict(record).items() if not (k in omit_none and v is None)}


def write_json(file: Path, plain: Any, base: Path | None = None) -> None:
    """Writes whole or not at all: a kill or a full disk mid-write never leaves half a file; never through a link
    at `file` or between `base` (default: its dir) and it (eagle3.safe_write)."""
    safe_write.write_text(file.parent if base is None else base, file, json.dumps(plain, indent=2) + "\n")


def read_record(file: Path, cls: type[R], what: str) -> R:
    """The record in `file`; ConfigError naming the file when it is not one (cut short, not JSON, wrong types)."""
    try:
        return cls.from_dict(json.loads(file.read_text(encoding="utf-8")))  # type: ignore[attr-defined]
    except (OSError, ValueError, TypeError) as e:  # ValueError: JSON, UnicodeDecodeError and the record's own
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{file}: cannot be read as {what} ({why}; cut short by a kill or a full disk, or "
                          f"written by another tool?)") from None
