"""`eagle3 train [OVERRIDES ...]`: compose the run config with Hydra and hand it to eagle3.run.launch.

    eagle3 train                                  # tiny default, CPU
    eagle3 train optim.lr=3e-4 optim.epochs=2     # overrides
    eagle3 train -m optim.lr=3e-4,1e-3            # a sweep: one run dir per job
    eagle3 train --cfg job                        # print the composed config (no torch)

Hydra's own command line: every override, -m/--multirun, --cfg, --help and --hydra-help as `python launch.py`
takes them (launch.py runs this module).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra._internal.sources_registry import SourcesRegistry
from hydra.core.plugins import Plugins
from hydra.plugins.config_source import ConfigSource
from omegaconf import DictConfig

from eagle3.config import register_configs
from eagle3.verifier.shape import register_resolvers

# conf/ of the checkout (an absolute path: Hydra then reads it wherever the command is started from).
CONF = str(Path(__file__).resolve().parents[2] / "conf")

register_configs()  # the schemas
register_resolvers()  # model=auto: ${verifier_config:<path>,<key>}


def copy_sharing_the_store(source: ConfigSource, memo: dict[int, Any]) -> ConfigSource:
    """A copy of Hydra's source of the structured configs that shares the process's one ConfigStore instead of
    copying it whole. Hydra deep-copies its config repository for every group it lists, so `eagle3 train --help`
    copied the store (every schema stored, Hydra's own and its plugins' configs) 92 times, two thirds of the
    command's CPU time. Sharing it changes nothing read: the store hands out a deep copy of a node on every load
    (ConfigStore.load), and nothing but ConfigStore.store() writes it."""
    clone = copy.copy(source)
    memo[id(source)] = clone
    for name, value in vars(source).items():
        if name != "store":
            setattr(clone, name, copy.deepcopy(value, memo))
    return clone


Plugins.instance()  # Hydra's scan of its plugins registers the config source classes it then uses (its own copies)
SourcesRegistry.instance().resolve("structured").__deepcopy__ = copy_sharing_the_store  # type: ignore[attr-defined]


@hydra.main(version_base="1.3", config_path=CONF, config_name="train")
def app(cfg: DictConfig) -> float | None:
    from eagle3.run.launch import launch

    return launch(cfg)


def main(argv: list[str] | None = None) -> int:
    """Hydra reads its arguments from sys.argv: `argv` (the words after the verb) replaces what follows the
    program's name there. Hydra ends the process itself on a refused config (SystemExit)."""
    if argv is not None:
        sys.argv[1:] = argv
    try:
        app()
    except KeyboardInterrupt:  # Ctrl-C outside the job's own handler (eagle3/run/launch.py): Hydra composing it
        from eagle3.console import interrupted

        raise interrupted("interrupted (Ctrl-C) before the run started; nothing was written") from None
    return 0
