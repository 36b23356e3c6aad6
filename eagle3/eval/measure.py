"""Measured acceptance of a draft on a fixed set of prompts, with the lossless check and the teacher-forced
tau_sim of the same sequences beside it.

Definitions (those of serving):
- accept_len: tokens per verify step, the bonus token included: mean over verify steps of (accepted + 1).
  The prompt's own forward (prefill), which makes the first token without any draft, is not a verify step.
- accept_rate[j]: share of the verify steps that proposed draft token j (0-based) in which it was accepted.
  Every verify step proposes all k tokens, and in a chain token j is accepted only if token j-1 is, so the
  rates lie in [0, 1], never increase with j, and accept_len = 1 + sum_j accept_rate[j] (as tau_sim =
  1 + sum_j full_acc_j).
At temperature T > 0 the decoding is speculative sampling (eagle3.decoding.drafting.verify), so the rates are those
of serving at T; the output is then a sample, checked lossless in distribution by the test suite rather than
token by token here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from eagle3.console import mapped_with_progress
from eagle3.decoding.aux_layers import aux_layer_ids
from eagle3.decoding.drafting import (
    Decode,
    Sampling,
    check_draft,
    speculative_decode,
    verifier_pass,
)
from eagle3.decoding.plain import greedy_decode, next_token_logits, plain_decode
from eagle3.errors import ConfigError
from eagle3.eval.metric_sums import accumulate, summarize
from eagle3.eval.prompts import Prompt, check_prompts, prompt_origin


class LosslessError(RuntimeError):
    """Speculative decoding produced other tokens than the verifier's greedy decoding."""


class AcceptanceProbe:
    """A verifier and a fixed set of prompts, loaded once; measures any draft against them. The verifier's
    greedy continuations (the reference of the lossless check) do not depend on the draft and are computed
    once, at the first measurement. At `temperature` > 0 every measurement samples with a generator seeded
    from `seed` (the same draws for the same draft). `cached`: the KV-cached harness (same decisions as the
    uncached one, faster)."""

    def __init__(self, verifier: torch.nn.Module, prompts: Sequence[Sequence[int]], k: int, max_new_tokens: int,
                 temperature: float = 0.0, seed: int = 0, cached: bool = True):
        # k, max_new_tokens and temperature are checked where they are declared (config.AcceptEvalConfig).
        if not prompts:
            raise ConfigError("no prompts")
        self.verifier, self.k, self.max_new_tokens = verifier, k, max_new_tokens
        self.temperature, self.seed, self.cached = float(temperature), seed, cached
        # Kept with their origin (a file's line, a val row), which error messages name.
        self.prompts = [Prompt(p, prompt_origin(p, i)) for i, p in enumerate(prompts)]
        self.greedy: list[list[int]] | None = None
        check_prompts(self.prompts, verifier.config.vocab_size,
                      getattr(verifier.config, "max_position_embeddings", None), max_new_tokens, k)

    @torch.no_grad()
    def measure(self, draft: torch.nn.Module, teacher_forced: bool = True, progress: bool = False) -> dict[str, Any]:
        """Decodes every prompt speculatively and reports the acceptance and (if `teacher_forced`) tau_sim of the
        same sequences. Greedy (T = 0): checks the output against the verifier's greedy decoding and raises
        LosslessError naming the first prompt and position that differ. T > 0: the sequences are samples.
        `progress`: a bar on stderr for each decoding pass (prompts done, tokens/s, time left)."""
        check_draft(draft)
        aux_ids = aux_layer_ids(draft, self.verifier)
        sampling = Sampling(self.temperature, self.seed)
        was_training = draft.training
        draft.eval()
        try:
            start = time.perf_counter()
            decodes = mapped_with_progress(
                lambda p: speculative_decode(self.verifier, draft, p, self.k, self.max_new_tokens, aux_ids, sampling,
                                             cached=self.cached),
                self.prompts, f"speculative decoding (k={self.k})", lambda d: len(d.tokens), progress)
            decode_s = time.perf_counter() - start
            if sampling.greedy:
                if self.greedy is None:
                    plain = plain_decode if self.cached else greedy_decode
                    self.greedy = mapped_with_progress(lambda p: plain(self.verifier, p, self.max_new_tokens),
                                                       self.prompts, "plain greedy decoding (the reference)", len,
                                                       progress)
                near_tie_flips = check_lossless(self.verifier, self.prompts, [d.tokens for d in decodes], self.greedy)
                sequences = self.greedy
            else:
                sequences = [d.tokens for d in decodes]
            tau = (teacher_forced_tau(self.verifier, draft, self.prompts, sequences, self.k, aux_ids)
                   if teacher_forced else {})
        finally:
            draft.train(was_training)
        vocab = ({"greedy_outside_draft_vocab": outside_draft_vocab(draft, sequences),
                  "near_tie_flips": near_tie_flips} if sampling.greedy else
                 {"sampled_outside_draft_vocab": outside_draft_vocab(draft, sequences)})
        return {**acceptance(decodes, self.k), **tau, **vocab,
                "prompts": len(self.prompts), "k": self.k, "max_new_tokens": self.max_new_tokens,
                "temperature": self.temperature, "seed": self.seed if not sampling.greedy else None,
                "cached": self.cached, "tokens_generated": sum(len(d.tokens) for d in decodes),
                # T > 0: lossless in distribution, which the test suite checks (not per run: one sample says little).
                "lossless": True if sampling.greedy else None,
                "decode_s": decode_s, "wall_s": time.perf_counter() - start}


def acceptance(decodes: Sequence[Decode], k: int) -> dict[str, Any]:
    accepted = [n for d in decodes for n in d.accepted]
    steps = len(accepted)
    rates = [sum(n > j for n in accepted) / steps for j in range(k)]
    return {"accept_len": 1.0 + sum(accepted) / steps, "accept_rate": rates, "verify_steps": steps,
            "verifier_forwards": steps + len(decodes)}  # + one prefill per prompt


def check_lossless(verifier: torch.nn.Module, prompts: Sequence[Sequence[int]], speculative: Sequence[list[int]],
                   greedy: Sequence[list[int]]) -> int:
    """Raises LosslessError at the first prompt and position where the two outputs differ, saying whether the
    verifier's top two logits there are a near-tie (which rounding in forwards of other lengths can flip).

    A verifier held in a 16-bit dtype (data=online on CUDA reuses its bf16 copy) keeps 8 to 11 significant bits:
    the speculative verify and plain decoding, forwards over different lengths, then flip the argmax wherever the
    top two logits are within a few of its rounding steps. Such a divergence is numerics, not the drafting loop:
    it is counted (returned) and that prompt's check ends there; in fp32 every divergence raises."""
    dtype = next(verifier.parameters()).dtype
    sixteen_bit = dtype in (torch.bfloat16, torch.float16)
    flips = 0
    for i, (spec, ref) in enumerate(zip(speculative, greedy)):
        if spec == ref:
            continue
        pos = next(j for j, (a, b) in enumerate(zip(spec, ref)) if a != b)
        logits = next_token_logits(verifier, list(prompts[i]) + ref[:pos])
        top2 = logits.float().topk(2).values
        gap, scale = float(top2[0] - top2[1]), max(1.0, float(top2[0].abs()))
        if sixteen_bit and gap <= 4 * torch.finfo(dtype).eps * scale:
            flips += 1
            continue
        tie = (f"the verifier's top two logits there differ by only {gap:.3g}: a near-tie that fp32 rounding in "
               f"forwards of different lengths can flip, so this may be numerics rather than a drafting bug"
               if gap <= 1e-4 * scale else
               f"the verifier's top two logits there differ by {gap:.3g} (not a tie): a bug in the drafting loop")
        raise LosslessError(f"speculative decoding is not lossless: {prompt_origin(prompts[i], i)}, new token "
                            f"#{pos}: speculative {spec[pos]}, greedy {ref[pos]}; {tie}")
    return flips


@torch.no_grad()
def teacher_forced_tau(verifier: torch.nn.Module, draft: torch.nn.Module, prompts: Sequence[Sequence[int]],
                       continuations: Sequence[list[int]], ttt_steps: int, aux_ids: Sequence[int]) -> dict[str, Any]:
    """tau_sim of `draft` on prompt + continuation, loss on the continuation only, computed as training's val
    pass does (speculators' shift_batch and forward metrics, summarize below) with `ttt_steps`.

    Also the chain a decoder would accept if it started drafting at each position (its proposals checked
    against the verifier's actual next tokens), averaged two ways over the positions: `chain_len_mean` is
    tau_sim's kind of average; `chain_len_harmonic` weights each position by the verify steps a decoder spends
    there (a stretch where L tokens pass per step costs 1/L steps per token), which is what accept_len counts
    when acceptance varies slowly along a sequence."""
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3.data import shift_batch

    device = draft.fc.weight.device
    loss_config = resolve_loss_config("kl_div", "eager")  # only the accuracies are reported
    sums: dict[str, Any] = {}
    chains: list[torch.Tensor] = []
    for prompt, cont in zip(prompts, continuations):
        ids = list(prompt) + list(cont)
        states = verifier_pass(verifier, ids, aux_ids)
        sample = shift_batch({
            "input_ids": torch.tensor(ids), "hidden_states": states.aux, "verifier_last_hidden_states": states.last,
            "loss_mask": torch.tensor([0] * len(prompt) + [1] * len(cont)), "lengths": torch.tensor([len(ids)]),
            "position_ids": torch.arange(len(ids)),
        })
        batch = {k: v.unsqueeze(0).to(device) for k, v in sample.items() if k != "lengths"}
        batch["document_ids"] = torch.zeros_like(batch["input_ids"])
        steps, _, metrics = draft(**batch, ttt_steps=ttt_steps, loss_config=loss_config)
        accumulate(sums, metrics)
        if steps is not None:  # P-EAGLE's forward returns no proposals (its depths are sampled positions)
            chains.append(chain_lengths(draft, steps, ids, len(prompt)))
    metrics = summarize(sums)
    lengths = torch.cat(chains).float() if chains else None
    return {"tau_sim": float(metrics["tau_sim"]), "tau_sim_ttt_steps": ttt_steps,
            "full_acc": [float(metrics[f"full_acc_{j}"]) for j in range(ttt_steps)],
            "chain_len_mean": None if lengths is None else float(lengths.mean()),
            "chain_len_harmonic": None if lengths is None else float(1 / (1 / lengths).mean())}


def chain_lengths(draft: torch.nn.Module, steps: list[torch.Tensor], ids: list[int], prompt_len: int) -> torch.Tensor:
    """1 + the draft tokens a chain starting at each continuation position would get accepted. Step j at shifted
    index t proposes token t+2+j (speculators' alignment); with teacher forcing its input is the true token,
    which is the draft's own while the chain lives. Starts whose chain would run past the end are left out."""
    k, n = len(steps), len(ids)
    proposed = torch.stack([s[0].cpu() for s in steps])  # [k, n-1] draft vocabulary ids
    if draft.d2t is not None:
        proposed = proposed + draft.d2t.cpu()[proposed]
    starts = torch.arange(prompt_len - 1, n - 1 - k)  # the first verify step drafts at index prompt_len - 1
    truth = torch.tensor(ids)[starts[:, None] + 2 + torch.arange(k)]  # [starts, k]
    hits = (proposed[:, starts].T == truth).long().cumprod(dim=1)
    return 1 + hits.sum(dim=1)


def outside_draft_vocab(draft: torch.nn.Module, continuations: Sequence[list[int]]) -> float:
    """Share of the verifier's greedy tokens the draft cannot propose (not in its vocabulary). tau_sim's target
    is the best token within the draft vocabulary, so it counts such positions as hits when the draft picks it;
    the verifier never accepts them."""
    tokens = [t for c in continuations for t in c]
    if draft.t2d is None:
        return 0.0
    t2d = draft.t2d.cpu()
    return sum(not bool(t2d[t]) for t in tokens) / len(tokens)
