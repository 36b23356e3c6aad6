"""The one entry point: compose the run config with Hydra and hand it to eagle3.run.launch.

    python launch.py                                 # tiny default, CPU
    python launch.py optim.lr=3e-4 optim.epochs=2    # overrides
    python launch.py --cfg job                       # print the composed config
"""

import hydra
from omegaconf import DictConfig

from eagle3.config import register_configs
from eagle3.verifier.shape import register_resolvers

register_configs()  # the schemas
register_resolvers()  # model=auto: ${verifier_config:<path>,<key>}


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from eagle3.run.launch import launch

    return launch(cfg)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C outside the job's own handler (eagle3/run/launch.py): Hydra composing it
        from eagle3.console import interrupted

        raise interrupted("interrupted (Ctrl-C) before the run started; nothing was written") from None
