"""The launcher process: launch, inputs before ranks, starting ranks, resume, Hydra callbacks, how a job ended."""
