"""Command-line options from a schema's fields (eagle3/config/), so a CLI restates neither a default, a choice nor
a range check of a value a run's config also has.

`add_fields` adds one option per field: its type, its default, its Enum's names as the choices, and its help from
the comment next to the field. `checked` builds the schema from the parsed values and runs the schema's own check,
so `--temperature -1` is refused with the message `eval.accept.temperature=-1` gets, naming the flag.

Imports neither torch nor speculators: the CLIs' --help goes through it.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import re
import tokenize
import types
import typing
from collections.abc import Callable, Mapping
from enum import Enum
from functools import cache
from typing import Any, TypeVar

from eagle3.errors import ConfigError

S = TypeVar("S")


@cache
def field_comments(schema: type) -> dict[str, str]:
    """The comment of each field of a dataclass in its source: the one after it on its line, else the comment
    lines just above it."""
    lines = inspect.getsource(schema).splitlines()
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0] - 1] = tok.string.lstrip("#").strip()
    out: dict[str, str] = {}
    for i, line in enumerate(lines):
        match = re.match(r"\s+(\w+)\s*:", line)
        if not match or line.lstrip().startswith("#"):
            continue
        above: list[str] = []
        j = i - 1
        while j >= 0 and lines[j].lstrip().startswith("#"):
            above.insert(0, comments.get(j, ""))
            j -= 1
        text = comments.get(i) or " ".join(above)
        if text:
            out.setdefault(match.group(1), text)
    return out


def _value_type(hint: Any) -> Any:
    """int for `int | None`, the hint itself otherwise."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return hint


def add_fields(parser: argparse.ArgumentParser, schema: type, flags: Mapping[str, str], key: str,
               helps: Mapping[str, str] | None = None, defaults: Mapping[str, Any] | None = None) -> None:
    """One option per `flags` entry (field name -> flag) of the dataclass `schema`, whose fields a run's config
    names `<key>.<field>`. `helps` replaces a field's comment as its help, `defaults` its schema default."""
    hints = typing.get_type_hints(schema)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    comments = field_comments(schema)
    for name, flag in flags.items():
        value_type = _value_type(hints[name])
        default = (defaults or {}).get(name, fields[name].default)
        kwargs: dict[str, Any] = {"dest": name, "default": default, "type": value_type}
        if isinstance(value_type, type) and issubclass(value_type, Enum):
            kwargs.update(type=str, choices=[m.value for m in value_type],
                          default=default.value if isinstance(default, Enum) else default)
        shown = kwargs["default"]
        said = f"default: {shown:g}" if isinstance(shown, float) else f"default: {shown}"
        text = (helps or {}).get(name) or comments.get(name, "")
        kwargs["help"] = (f"{text} " if text else "") + (f"({said}, as {key}.{name})" if shown is not None
                                                          else f"(as {key}.{name})")
        parser.add_argument(flag, **kwargs)


def checked(args: argparse.Namespace, schema: type[S], flags: Mapping[str, str], key: str,
            check: Callable[[S], None], **fixed: Any) -> S:
    """The schema with the parsed values of `flags`' fields (a None value: the schema's default) and `fixed`,
    after its `check`; a ConfigError names the flag beside the config key."""
    hints = typing.get_type_hints(schema)
    values = dict(fixed)
    for name in flags:
        value = getattr(args, name)
        if value is not None:
            value_type = _value_type(hints[name])
            is_enum = isinstance(value_type, type) and issubclass(value_type, Enum)
            values[name] = value_type(value) if is_enum else value
    instance = schema(**values)
    try:
        check(instance)
    except ConfigError as e:
        message = str(e)
        for name, flag in flags.items():
            if message.startswith(f"{key}.{name}:"):
                message = f"{flag} ({key}.{name}):{message[len(key) + len(name) + 2:]}"
        raise ConfigError(message) from None
    return instance
