"""Speculative decoding with a draft: drafting and verifying, sampling, rollouts and their loss."""
