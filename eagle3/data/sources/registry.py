"""The data sources' registry: `data.name` -> its schema (a DataConfig subclass whose methods are the source).
A source registers itself with `@register` when its module is imported; eagle3.data.sources imports the built-in
ones. Imports neither torch nor speculators: composition and `--cfg job` go through here."""

from __future__ import annotations

from typing import TypeVar

from hydra.core.config_store import ConfigStore

from eagle3.config import DataConfig
from eagle3.errors import ConfigError

SOURCES: dict[str, type[DataConfig]] = {}
Schema = TypeVar("Schema", bound=type[DataConfig])


def register(schema: Schema) -> Schema:
    """Registers a source under its schema's default `name`, and stores the schema as `data/base_<name>` for its
    option file's defaults list (conf/data/<name>.yaml: `defaults: [base_<name>]`)."""
    name = schema.name
    assert isinstance(name, str), f"{schema.__name__} gives no default name"
    SOURCES[name] = schema
    ConfigStore.instance().store(group="data", name=f"base_{name}", node=schema)
    return schema


def source_schema(name: object) -> type[DataConfig]:
    if not isinstance(name, str) or name not in SOURCES:
        raise ConfigError(f"data.name: {name!r} is no data source; known: {', '.join(sorted(SOURCES))}")
    return SOURCES[name]
