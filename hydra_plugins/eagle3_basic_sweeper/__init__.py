"""eagle3's default sweeper (`hydra/sweeper=eagle3_basic`): Hydra's basic sweeper, with every job's config checked
before the first job starts, and one summary of the failed jobs at the end (see eagle3_basic_sweeper.sweeper)."""
