"""The draft's architecture: layer types and flags, parameter and activation terms, rope, activation checkpointing,
its TTT attention on CPU (ttt_attention) and its dense masks (masks)."""
