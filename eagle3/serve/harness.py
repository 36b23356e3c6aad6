"""The engine beside eagle3.eval's harness: the same prompts, k, temperature and token budget decoded by the
harness (the KV-cached speculative decoding of eagle3.eval.accept, fp32), and the two sets of counts compared.

- T = 0, fp32: the engine must make the same tokens, drafts and accepted tokens per position as the harness, with
  one exception: two fp32 implementations of a deep verifier (vLLM's CPU kernels, transformers') round differently,
  and where the verifier's two best next tokens are nearly tied the engine may pick the other. For each prompt whose
  tokens differ, the first divergence is located and the verifier (the harness's, one forward over the prompt and
  the tokens both made) gives the logit gap there between the harness's token and the engine's: a near-tie when it
  is at most NEAR_TIE times the largest |logit| there (1e-3: a hundred times the relative difference of the two
  implementations' hidden states on SmolLM2, 1e-5). Prompts that diverge at a near-tie are equal up to it and
  their counts, which differ after it, are left out of the comparison; every other prompt's counts must be equal,
  and a divergence that is not a near-tie is NOT EQUAL.
- T = 0, bf16: the engine rounds otherwise, and near-ties of the verifier flip its greedy choice; the share of
  prompts whose tokens differ is reported instead of a verdict.
- T > 0: both are samples. Their accept_len agree when they differ by at most 3 standard errors of the
  difference (each accept_len's from the spread of the accepted counts over its verify steps; steps of one
  sequence are taken as independent, which understates the error a little).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagle3.serve.metrics import counts_acceptance

TOLERANCE_SE = 3.0
NEAR_TIE = 1e-3  # a divergence's logit gap over the largest |logit| there, at most (see above)


class Harness:
    """The verifier, loaded once on CPU in fp32, and one draft at a time (`load`), decoding as eagle3.eval.accept
    does."""

    def __init__(self, verifier_dir: Path):
        from eagle3.console import quiet_libraries
        from eagle3.verifier.model import Verifier

        quiet_libraries()
        self.verifier_dir = verifier_dir
        self.verifier = Verifier(verifier_dir, key="--verifier").load("cpu")
        self.checkpoint: Path | None = None

    def load(self, checkpoint: Path) -> Harness:
        """The draft of `checkpoint` (kept when it is the one loaded already)."""
        from eagle3.decoding.aux_layers import aux_layer_ids
        from eagle3.errors import ConfigError
        from eagle3.init.checkpoint import load_draft

        if checkpoint != self.checkpoint:
            try:
                self.draft = load_draft(checkpoint, "sdpa", "cpu", verifier_dir=self.verifier_dir).float().eval()
            except (OSError, ValueError) as e:
                raise ConfigError(f"cannot load the draft {checkpoint} for the verifier {self.verifier_dir}: "
                                  f"{e}") from None
            self.aux_ids = aux_layer_ids(self.draft, self.verifier)
            self.checkpoint = checkpoint
        return self

    def draft_timer(self, prompts: Sequence[Sequence[int]], max_new_tokens: int):
        """A DraftTimer of the loaded draft at the context of the middle of a decode (the prompts' mean length and
        half the new tokens, within the verifier's positions), on the threads the CPU engine's worker runs: it
        inherits this process's environment, so OMP_NUM_THREADS when set, else torch's default here."""
        import os

        import torch

        from eagle3.eval.speedup import DraftTimer

        context = sum(map(len, prompts)) // len(prompts) + max_new_tokens // 2
        positions = getattr(self.verifier.config, "max_position_embeddings", None) or 1 << 30
        given = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(given) if given.isdigit() and int(given) > 0 else torch.get_num_threads()
        return DraftTimer(self.verifier, self.draft, max(2, min(context, positions - 2)), threads)

    def decode(self, prompts: Sequence[Sequence[int]], k: int, max_new_tokens: int, temperature: float,
               seed: int) -> dict[str, Any]:
        """{"tokens": per prompt, "drafts", "accepted_per_position", "per_prompt", "accept_len", ...}"""
        import torch

        from eagle3.decoding.drafting import Sampling, speculative_decode
        from eagle3.device.threads import torch_threads

        sampling = Sampling(temperature, seed)
        with torch.no_grad(), torch_threads(1):
            decodes = [speculative_decode(self.verifier, self.draft, p, k, max_new_tokens, self.aux_ids, sampling,
                                          cached=True) for p in prompts]
        counts = [[sum(n > j for n in d.accepted) for j in range(k)] for d in decodes]
        drafts = sum(len(d.accepted) for d in decodes)
        per_position = [sum(c[j] for c in counts) for j in range(k)]
        per_prompt = [{"drafts": len(d.accepted), "per_position": c} for d, c in zip(decodes, counts)]
        return {"tokens": [d.tokens[:max_new_tokens] for d in decodes], "drafts": drafts,
                "accepted_per_position": per_position, "per_prompt": per_prompt,
                **counts_acceptance(drafts, per_position)}


    def divergences(self, prompts: Sequence[Sequence[int]], engine_tokens: Sequence[Sequence[int]],
                    harness_tokens: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
        """For each prompt whose engine and harness tokens differ: where they first differ, the two tokens, and
        the verifier's logits there (one forward over the prompt and the common tokens): the gap between the
        harness's token and the engine's, the two best tokens and their gap, the scale (largest |logit|), and
        whether it is a near-tie. The report keeps the prompt's ids and the common tokens, so that anyone can
        run the forward again."""
        import torch

        from eagle3.decoding.plain import next_token_logits
        from eagle3.device.threads import torch_threads

        found = []
        for i, (prompt, engine, harness) in enumerate(zip(prompts, engine_tokens, harness_tokens)):
            if list(engine) == list(harness):
                continue
            common = min(len(engine), len(harness))
            at = next((j for j in range(common) if engine[j] != harness[j]), common)
            entry: dict[str, Any] = {"prompt": i, "at": at, "prompt_ids": list(prompt),
                                     "common_tokens": list(harness[:at])}
            if at == common:  # one is a prefix of the other: no token to weigh against another
                found.append(entry | {"near_tie": False, "why": f"{len(engine)} engine tokens, {len(harness)} "
                                                                f"harness tokens"})
                continue
            with torch.no_grad(), torch_threads(1):
                logits = next_token_logits(self.verifier, [*prompt, *harness[:at]]).double()
            top = torch.topk(logits, 2)
            gap = float(logits[harness[at]] - logits[engine[at]])
            scale = float(logits.abs().max())
            found.append(entry | {
                "harness_token": int(harness[at]), "engine_token": int(engine[at]), "logit_gap": gap,
                "top2_tokens": top.indices.tolist(), "top2_logits": top.values.tolist(),
                "top2_gap": float(top.values[0] - top.values[1]), "logit_scale": scale,
                "relative_gap": abs(gap) / scale if scale else float("inf"),
                "near_tie": abs(gap) <= NEAR_TIE * scale})
        return found


def counts_agree(engine: dict[str, Any], harness: dict[str, Any]) -> bool:
    """One prompt's drafts and accepted tokens per position, the engine's (SpecCounters) and the harness's."""
    from eagle3.serve.metrics import padded

    k = len(harness["per_position"])
    return engine["drafts"] == harness["drafts"] and padded(engine["per_position"], k) == harness["per_position"]


def side_by_side(engine: dict[str, Any], harness: dict[str, Any], temperature: float, dtype: str) -> dict[str, Any]:
    """{"equal": bool or None, "diverged_prompts": [...], "share_diverged", "verdict": a sentence}"""
    diverged = [i for i, (a, b) in enumerate(zip(engine["tokens"], harness["tokens"])) if a != b]
    share = len(diverged) / len(harness["tokens"])
    counts_equal = (engine["drafts"] == harness["drafts"]
                    and engine["accepted_per_position"] == harness["accepted_per_position"])
    out: dict[str, Any] = {"diverged_prompts": diverged, "share_diverged": share}
    if temperature == 0:
        equal = counts_equal and not diverged
        found = harness.get("divergences")
        if dtype == "float32" and diverged and found is not None and all(d["near_tie"] for d in found):
            # equal up to the near-ties: the counts of every prompt that did not diverge agree
            same = [i for i in range(len(harness["tokens"])) if i not in diverged]
            disagree = [i for i in same if not counts_agree(engine["per_prompt"][i], harness["per_prompt"][i])]
            equal = not disagree
            ties = ", ".join(f"prompt {d['prompt']} at token {d['at']} (logit gap {abs(d['logit_gap']):.2e}, "
                             f"{d['relative_gap']:.1e} of the scale {d['logit_scale']:.3g})" for d in found)
            verdict = (f"EQUAL up to near-ties: {len(same)} of {len(harness['tokens'])} prompts have the harness's "
                       f"tokens and counts; {len(diverged)} diverged where the verifier's two best tokens are "
                       f"nearly tied (at most {NEAR_TIE:g} of the largest |logit|), equal up to there: {ties}"
                       if equal else
                       f"NOT EQUAL in fp32: prompts {disagree} have the harness's tokens but not its counts "
                       f"(the others diverged at near-ties: {ties})")
            return out | {"equal": equal, "near_ties": len(found), "divergences": found, "verdict": verdict}
        if dtype == "float32":
            real = [d for d in found or [] if not d["near_tie"]]
            verdict = ("EQUAL: the engine's tokens, drafts and accepted tokens per position are the harness's" if equal
                       else f"NOT EQUAL in fp32: {len(diverged)} of {len(harness['tokens'])} prompts differ in their "
                            f"tokens; drafts {engine['drafts']} vs {harness['drafts']}, accepted per position "
                            f"{engine['accepted_per_position']} vs {harness['accepted_per_position']}"
                            + "".join(f"; prompt {d['prompt']} diverged at token {d['at']} where the verifier's "
                                      f"logit gap is {abs(d['logit_gap']):.3g} ({d['relative_gap']:.1e} of its "
                                      f"scale: no near-tie)" if "logit_gap" in d else
                                      f"; prompt {d['prompt']}: {d['why']}" for d in real))
            if found is not None:
                out["divergences"] = found
        else:
            verdict = (f"{dtype}: {100 * share:.0f}% of the prompts ({len(diverged)} of {len(harness['tokens'])}) "
                       "decoded other tokens than the fp32 harness (near-ties of the verifier rounded otherwise)")
        return out | {"equal": equal, "verdict": verdict}
    if not engine["drafts"] or not harness["drafts"] or not (engine["accept_len_se"] or harness["accept_len_se"]):
        # No spread to judge a difference by: a tolerance of 0 would call two drafters that accept nothing "within"
        # it, which says nothing about whether the engine samples as the harness does.
        verdict = (f"accept_len {engine['accept_len'] or 1.0:.4f} (engine) vs {harness['accept_len'] or 1.0:.4f} "
                   f"(harness): no agreement to judge at T={temperature:g}: "
                   + ("one of them drafted nothing" if not engine["drafts"] or not harness["drafts"] else
                      "the accepted counts have no spread to judge a difference by (every verify step of both "
                      "accepted as many tokens: nothing, with an untrained draft)")
                   + "; measure a draft that gets some of its tokens accepted, or at T=0")
        return out | {"equal": None, "accept_len_difference": None, "tolerance": None, "within_tolerance": None,
                      "verdict": verdict}
    diff = engine["accept_len"] - harness["accept_len"]
    tolerance = TOLERANCE_SE * (engine["accept_len_se"] ** 2 + harness["accept_len_se"] ** 2) ** 0.5
    within = abs(diff) <= tolerance
    verdict = (f"accept_len {engine['accept_len']:.4f} (engine) vs {harness['accept_len']:.4f} (harness): difference "
               f"{diff:+.4f}, {'within' if within else 'OUTSIDE'} the tolerance {tolerance:.4f} "
               f"({TOLERANCE_SE:g} standard errors of the difference)")
    return out | {"equal": None, "accept_len_difference": diff, "tolerance": tolerance, "within_tolerance": within,
                  "verdict": verdict}
