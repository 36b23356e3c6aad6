"""What the launcher, the ranks and the plan ask of a data source (`Source`), and the sources by `data.name`. A
source's options are its schema (eagle3.config: DATA_SCHEMAS); its behaviour is a `Source` subclass registered here
under that schema with `@register(Schema)`, which eagle3.data.sources imports for the built-in ones. Imports neither
torch nor speculators."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from eagle3.config import DataConfig, add_data_schema, data_schema

if TYPE_CHECKING:
    from eagle3.config import DraftConfig, RunConfig, TrainConfig
    from eagle3.data.check import CheckReport
    from eagle3.data.loader import Loader
    from eagle3.data.online import OnlineVerifier
    from eagle3.plan.parts import DataStats, Term

Schema = TypeVar("Schema", bound=DataConfig)


class Source(Generic[Schema]):
    """A data source with its options (`data`, the run's data config)."""

    def __init__(self, data: Schema) -> None:
        self.data = data

    def materialize(self, cfg: RunConfig, verifier_dir: Path) -> Path:
        """The data dir the ranks read, built (into cfg.cache_dir) when the source builds one; in the launcher,
        before any rank starts."""
        raise NotImplementedError

    def refuse_early(self, cfg: TrainConfig) -> None:
        """What the source refuses from the config and its paths alone, before the run dir is written or anything
        is built (the launcher's check of a new job); the schema's own checks ran already."""

    def check_rows(self, cfg: RunConfig, verifier_dir: Path, data_dir: Path) -> CheckReport:
        """The start-up check of the data dir's rows (eagle3.data.check's quick part), before any rank starts."""
        raise NotImplementedError

    def loaders(self, data_dir: Path, verifier: OnlineVerifier | None, run_dir: Path | None = None,
                **common: Any) -> tuple[Loader, Loader]:
        """A rank's train and val loaders (eagle3.data.loader.build_loaders, `common` its LoaderSpec's fields);
        `run_dir`: where a source may keep what it computed for the epochs after the first (data=online's
        data.cache_gb)."""
        raise NotImplementedError

    def hidden_cache_bytes(self) -> int:
        """Disk the run may use in its run dir for hidden states computed in the loop (the plan counts it)."""
        return 0

    def plan_stats(self, draft: DraftConfig) -> DataStats | None:
        """The plan's token counts and hidden-state bytes on disk (eagle3.plan.memory.DataStats), None when there are
        no rows to count before the run reads them."""
        raise NotImplementedError

    def no_rows_reason(self) -> str:
        """Why plan_stats has no rows to count ("" for the generic reason: no dataset yet)."""
        return ""

    def plan_notes(self, run: TrainConfig) -> list[str]:
        """More lines for the plan about building this data (data=regenerate: the expected regeneration time)."""
        return []

    def buffer_terms(self, draft: DraftConfig, device_type: str) -> list[Term]:
        """The plan's terms for the hidden states one micro-batch needs (eagle3.plan.memory)."""
        raise NotImplementedError


SOURCES: dict[str, type[Source]] = {}
S = TypeVar("S", bound=type[Source])


def register(schema: type[DataConfig]) -> Callable[[S], S]:
    """Registers a source's behaviour under its schema's default `name`, and the schema with eagle3.config
    (stored as `data/base_<name>` for its option file's defaults list: conf/data/<name>.yaml)."""

    def add(source: S) -> S:
        add_data_schema(schema)  # a built-in one is there already: stored again, the same
        SOURCES[str(schema.name)] = source
        return source

    return add


@contextmanager
def registered(schema: type[DataConfig], source: S) -> Iterator[S]:
    """`source` registered under `schema` as `@register(schema)` registers it, for the block only: after it the
    sources, eagle3.config's data schemas and Hydra's `data` group are as they were before (a source a test adds
    is gone for the next test, which adds its own)."""
    from hydra.core.config_store import ConfigStore

    from eagle3.config import DATA_SCHEMAS

    repo = ConfigStore.instance().repo
    before = dict(SOURCES), dict(DATA_SCHEMAS), dict(repo.get("data", {}))
    register(schema)(source)
    try:
        yield source
    finally:
        for registry, entries in zip((SOURCES, DATA_SCHEMAS, repo.setdefault("data", {})), before):
            registry.clear()
            registry.update(entries)


def source_of(data: DataConfig) -> Source:
    """The source that `data` (a run's data config) selects by its name."""
    data_schema(data.name)  # one message for a name no source has
    return SOURCES[data.name](data)
