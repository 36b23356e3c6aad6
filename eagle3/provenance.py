"""Where a result came from: the project's git commit, the versions of the libraries that made it, and the sha256
of the checkpoint it measured. Recorded in summary.json and in every accept and serve report.

The git and version lookups are speculators' own (`speculators.provenance`); this module only picks what a report
of this project records.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

PACKAGES = ("torch", "transformers", "speculators")


def provenance(checkpoint: str | Path | None = None, engine: dict[str, str] | None = None) -> dict[str, Any]:
    """{"git_commit", "git_dirty", "versions": {package: version}, "checkpoint_sha256"?}; `engine` adds the
    serving engine's versions (it runs in its own environment, so they are asked from there)."""
    from speculators.provenance import find_package_repo, git_diff, git_sha, pkg_version

    repo = find_package_repo("eagle3")
    record: dict[str, Any] = {"git_commit": git_sha(repo), "git_dirty": bool(git_diff(repo, timeout=10)),
                              "versions": {p: pkg_version(p) for p in PACKAGES} | (engine or {})}
    if checkpoint is not None:
        record["checkpoint_sha256"] = checkpoint_sha256(Path(checkpoint))
    return record


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
