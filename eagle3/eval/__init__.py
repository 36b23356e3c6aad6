"""Evaluation beyond the training loss: the acceptance length measured by real speculative decoding.

drafting.py   the verifier's hidden states, the draft's chain proposal, speculative (greedy or sampled, cached or
              not) and plain decoding
measure.py    acceptance over a prompt set, the lossless check, teacher-forced tau_sim of the same sequences
prompts.py    prompts from a JSONL file or a dataset's val split
accept.py     the command line: python -m eagle3.eval.accept
at_val.py     eval.accept in a training run: accept_len in the val rows
speedup.py    the serving speedup accept rates predict at given or measured step costs
"""
