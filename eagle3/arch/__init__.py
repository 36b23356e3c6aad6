"""The draft's architecture: layer types and flags, parameter and activation terms, rope, activation checkpointing."""
