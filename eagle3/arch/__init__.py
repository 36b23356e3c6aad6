"""The draft's architecture: layer types and flags, parameter and activation terms, rope, activation checkpointing,
and its TTT attention on CPU (ttt_attention)."""
