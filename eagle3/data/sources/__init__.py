"""Data sources, one module each, registered by name (eagle3.data.sources.registry): `data=<name>` composes its
schema (eagle3.config; conf/data/<name>.yaml holds only the deltas from it), and the run types `data` by its `name`.

A source is its schema (a DataConfig subclass with its own fields and `check`, in eagle3.config) and its behaviour:
a `Source` subclass, what the launcher (`materialize`, `check_rows`), the ranks (`loaders`) and the plan
(`plan_stats`, `buffer_terms`) ask of it, looked up by `source_of(cfg.data)`. Adding one is a schema, a module with
a `@register(Schema)`ed Source, and an option file conf/data/<name>.yaml."""

from eagle3.data.sources import offline, online, regenerate, tiny  # noqa: F401  (each registers itself)
from eagle3.data.sources.registry import SOURCES, Source, register, registered, source_of

__all__ = ["SOURCES", "Source", "register", "registered", "source_of"]
