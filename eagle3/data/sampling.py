"""Token rows sampled from a verifier: random prompts (masked out of the loss) continued by sampling from the model
itself, like regenerated responses. The tiny default's data (eagle3.data.synthetic) and online rows sampled without
a data.path (eagle3.data.token_rows) both start here."""

from __future__ import annotations

import torch
from tqdm import tqdm

from eagle3.config import SynthConfig
from eagle3.errors import DataError
from eagle3.formats.row_formats import Row


@torch.no_grad()
def sample_rows(model: torch.nn.Module, synth: SynthConfig) -> list[Row]:
    """Random prompts (masked out of the loss) continued by sampling from `model` itself."""
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(synth.seed)
    rows: list[Row] = []
    n, bs = synth.num_samples, synth.batch_size
    for start in tqdm(range(0, n, bs), desc="sampling sequences", unit="batch", leave=False):
        prompt = torch.randint(0, vocab, (min(bs, n - start), synth.prompt_len), generator=gen)
        ids = _sample(model, prompt, synth.response_len, synth.temperature, gen)
        mask = [0] * synth.prompt_len + [1] * synth.response_len
        rows.extend((seq, mask) for seq in ids.tolist())
    return rows


def _sample(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, temperature: float,
            gen: torch.Generator) -> torch.Tensor:
    device = next(model.parameters()).device
    out = model(input_ids=prompt.to(device), use_cache=True)
    tokens = [prompt]
    for _ in range(new_tokens):
        probs = torch.softmax(out.logits[:, -1].float().cpu() / temperature, dim=-1)
        if not torch.isfinite(probs).all():  # torch.multinomial would fail with a traceback
            raise DataError("the verifier's next-token probabilities are not finite (NaN or inf in its weights or "
                            "activations), so no sequence can be sampled from it; check model.verifier")
        nxt = torch.multinomial(probs, 1, generator=gen)
        tokens.append(nxt)
        out = model(input_ids=nxt.to(device), past_key_values=out.past_key_values, use_cache=True)
    return torch.cat(tokens, dim=1)
