"""`python launch.py ARGS` is `eagle3 train ARGS` (eagle3/cli/train.py): Hydra's overrides, -m, --cfg job.

    python launch.py                                 # tiny default, CPU
    python launch.py optim.lr=3e-4 optim.epochs=2    # overrides
    python launch.py --cfg job                       # print the composed config
"""

from eagle3.cli.train import main

if __name__ == "__main__":  # Ctrl-C while Hydra composes: one line and exit 130 (eagle3/cli/train.py)
    main()
