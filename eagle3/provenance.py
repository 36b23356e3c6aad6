"""Where a result came from: the project's git commit, the versions of the libraries that made it, and the sha256
of the checkpoint it measured. Recorded in summary.json and in every accept and serve report.

The git and version lookups are speculators' own (`speculators.provenance`); this module only picks what a report
of this project records.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGES = ("torch", "transformers", "speculators")


def provenance(checkpoint: str | Path | None = None, engine: dict[str, str] | None = None) -> dict[str, Any]:
    """{"git_commit", "git_dirty", "versions": {package: version}, "checkpoint_sha256"?}; `engine` adds the
    serving engine's versions (it runs in its own environment, so they are asked from there)."""
    lookups = speculators_provenance()
    repo = lookups.find_package_repo("eagle3")
    record: dict[str, Any] = {"git_commit": lookups.git_sha(repo),
                              "git_dirty": bool(lookups.git_diff(repo, timeout=10)),
                              "versions": {p: lookups.pkg_version(p) for p in PACKAGES} | (engine or {})}
    if checkpoint is not None:
        record["checkpoint_sha256"] = checkpoint_sha256(Path(checkpoint))
    return record


@functools.cache
def speculators_provenance() -> ModuleType:
    """speculators.provenance, which imports only the standard library: run from its file when the speculators
    package is not imported yet, whose import (torch, transformers: seconds) a command that only records where
    its results come from (eagle3.serve, before its servers start) does not need."""
    if "speculators" not in sys.modules:
        package = importlib.util.find_spec("speculators")
        locations = package.submodule_search_locations if package else None
        spec = importlib.util.spec_from_file_location("eagle3._speculators_provenance",
                                                      Path(locations[0]) / "provenance.py") if locations else None
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
                return module
            except ImportError:  # it came to import more than the standard library
                pass
    import speculators.provenance

    return speculators.provenance


def checkpoint_sha256(checkpoint: Path) -> str:
    """sha256 over a checkpoint dir's weights and config (its *.safetensors in name order, then config.json), so
    the same bytes on another machine give the same value; of the file itself when given a file."""
    files = [checkpoint] if checkpoint.is_file() else [*sorted(checkpoint.glob("*.safetensors")),
                                                       checkpoint / "config.json"]
    digest = hashlib.sha256()
    for f in files:
        with f.open("rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()
