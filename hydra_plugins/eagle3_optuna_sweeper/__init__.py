"""eagle3's Optuna sweeper for Hydra (`hydra/sweeper=optuna`): see optuna_sweeper.py.

`hydra_plugins` itself has no `__init__.py`: it is the namespace package in which Hydra discovers plugins.
"""
