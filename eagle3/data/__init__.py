"""Verifiers and datasets: build the tiny verifier, prepare speculators-format data, read it back."""
