"""SpecForge's own draft class, to check that a SpecForge-layout export (python -m eagle3.serve.export --format
specforge) loads in it. The specforge wheel pins torch, transformers and sglang of its own, but its modeling code runs
on the project's torch and transformers, so it is installed without its dependencies into a directory of its own
(`pip install --no-deps --target`), once, beside the engine venv, and put on sys.path by whoever loads it.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

from eagle3.engine.venv import last_line
from eagle3.errors import EngineError
from eagle3.safe_write import fresh_temp, open_write

PACKAGE, VERSION = "specforge", "0.2.0"
# What an EAGLE-3 draft of SpecForge's layout loads in (SGLang's LlamaForCausalLMEagle3 reads the same names).
DRAFT_MODULE, DRAFT_CLASS = "specforge.modeling.draft.llama3_eagle", "LlamaForCausalLMEagle3"


def default_dir() -> Path:
    """<$EAGLE3_CACHE or ~/.cache/eagle3>/engines/specforge-<version>."""
    cache = os.environ.get("EAGLE3_CACHE") or str(Path.home() / ".cache" / "eagle3")
    return Path(cache) / "engines" / f"{PACKAGE}-{VERSION}"


def install(target: Path | None = None) -> Path:
    """The directory to put on sys.path for `import specforge`: built at `target` (default_dir()) unless it is
    there already (network once, a 0.4 MB wheel). Safe from two processes at once: the second waits and reuses."""
    target = (target or default_dir()).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    module = target / Path(*DRAFT_MODULE.split(".")).with_suffix(".py")
    with open_write(target.parent, target.parent / f"{target.name}.lock", "w") as lock:  # never through a link
        fcntl.flock(lock, fcntl.LOCK_EX)
        if module.is_file():
            return target
        building, log = target.with_name(target.name + ".partial"), target.with_name(target.name + ".install.log")
        fresh_temp(target.parent, building)
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--target", str(building),
               f"{PACKAGE}=={VERSION}"]
        with open_write(log.parent, log, "w") as out:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            failed = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0
        if failed or not (building / module.relative_to(target)).is_file():
            raise EngineError(f"installing {PACKAGE}=={VERSION} into {target} failed ({last_line(log)}); log: {log}")
        fresh_temp(target.parent, target)  # one without the module is not a finished install (a link: removed)
        building.rename(target)  # whole or not at all: a half install is never found as a finished one
        return target
