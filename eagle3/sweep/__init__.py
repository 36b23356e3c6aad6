"""Across runs: comparison tables, Optuna studies, the objective a run returns to a sweeper."""
