"""Evaluation beyond the training loss: the acceptance length measured by real speculative decoding (the decoding
itself is eagle3.decoding's; eval.accept inside a training run is eagle3/train/val_acceptance.py).

measure.py    acceptance over a prompt set, the lossless check, teacher-forced tau_sim of the same sequences
metric_sums.py  the counted metrics' sums and ratios (tau_sim), the loop's too
prompts.py    prompts from a JSONL file or a dataset's val split
accept.py     measured acceptance with a trained draft (its command line: eagle3 accept)
speedup.py    the serving speedup accept rates predict at given or measured step costs
"""
