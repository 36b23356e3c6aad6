"""Regenerated responses: a prompt set's responses written anew by the verifier itself, so that a draft trains on
what the verifier says rather than on text another model wrote.

The prompts are a rows file's rows as eagle3.formats.row_formats reads them: conversations (`messages` or ShareGPT's
`conversations`) rendered with the verifier's chat template, or `input_ids` + `loss_mask`. Every masked-in span
(an assistant turn of a conversation) is one response to regenerate, so each span gives one prompt: the row's
tokens before it. A conversation that ends on a
user turn gives one more: the whole conversation with the generation prompt. Each prompt becomes one row: its ids
(mask 0) and the verifier's continuation (mask 1), up to `max_new_tokens` or the verifier's positions, ending at
its end-of-sequence token (included); nothing is tokenized again.

Generation is vLLM's server (eagle3/data/regenerate_vllm.py) when its engine environment is there (engine=auto,
the default; engine=vllm requires it), else transformers' `generate` in process (batched, left-padded, KV-cached;
engine=transformers). At temperature 0 it is greedy; above, each prompt draws its tokens from
a generator seeded by (seed, the prompt's index), so a row is the same whatever batch or chunk it falls in. The
rows are generated one batch at a time, each batch saved as a chunk file next to the cache entry, so a run stopped
mid-way continues from its last chunk and ends in the same files.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from eagle3.config import RegenerateDataConfig, Regeneration, RegenerationEngine, RowFormat
from eagle3.data.generation import BatchGenerator, Generation, Tick, row_seed
from eagle3.decoding.drafting import Sampling
from eagle3.errors import DataError
from eagle3.formats.cache import build_once, cache_key
from eagle3.formats.row_formats import BadSamples, ChatTokenizer, Row, read_rows
from eagle3.safe_write import refuse_links_in, write_text
from eagle3.verifier.model import Verifier

log = logging.getLogger(__name__)

def prompt_spans(row: Row) -> list[list[int]]:
    """The prompts of a row: its tokens before each maximal run of loss-mask 1 (each run a response)."""
    ids, mask = row
    return [ids[:i] for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])]


# docs/regenerate.md's rule, quoted where a row breaks it.
PROMPT_ONLY_RULE = "A prompt-only row has one placeholder token of mask 1 at the end."


def read_prompts(path: Path, verifier_dir: Path, vocab_size: int, bad: BadSamples,
                 row_format: RowFormat | str = RowFormat.auto, max_records: int | None = None,
                 max_chars: int | None = None) -> tuple[list[list[int]], dict[str, str]]:
    """Every prompt of the prompt set at `path` (any rows file eagle3.formats.row_formats reads; its first `max_records`
    records, its conversations of at most `max_chars` characters), in file order, and what the record says of the
    format its rows were read in."""
    chat: list[ChatTokenizer] = []  # built on the first messages row: input_ids rows need no tokenizer

    def tokenize_chat(messages: list[dict[str, Any]]) -> Row:
        if not chat:
            chat.append(Verifier(verifier_dir).chat_tokenizer())
        ids, mask = chat[0](messages)
        if messages and messages[-1].get("role") != "assistant":
            # A last user turn asks for one more response: the generation prompt's tokens follow the conversation,
            # and one mask-1 position after them marks where that response starts (it is never trained on).
            prompt = chat[0].render(messages, True)
            if prompt[:len(ids)] != ids:
                raise ValueError("the chat template renders the conversation differently with a generation prompt")
            ids, mask = prompt + [prompt[-1]], mask + [0] * (len(prompt) - len(ids)) + [1]
        return ids, mask

    rule = (f"data=regenerate regenerates each run of loss-mask 1, and \"{PROMPT_ONLY_RULE}\" (docs/regenerate.md): "
            f"append any token id to input_ids and a 1 to loss_mask")
    rows = read_rows(path, sys.maxsize, vocab_size, bad, tokenize_chat, row_format, rule, max_records, max_chars)
    return [prompt for row in rows for prompt in prompt_spans(row)], rows.record()


class _Ticker:
    """A logits processor for `generate` that changes nothing: each step it reports the tokens the rows still
    running are about to get (a finished row's last token is an end-of-sequence token, or its padding)."""

    def __init__(self, tick: Tick, eos: Sequence[int]):
        self.tick, self.eos = tick, torch.tensor(list(eos), dtype=torch.long)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        running = ~torch.isin(input_ids[:, -1].cpu(), self.eos) if len(self.eos) else torch.ones(len(input_ids))
        self.tick(int(running.sum()))
        return scores


class _RowSampler:
    """A logits processor for `generate`: each row's next token drawn from softmax(logits / T) with the row's own
    generator, returned as the only finite score, so that greedy search takes it."""

    def __init__(self, samplings: Sequence[Sampling]):
        self.samplings = samplings

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = self.samplings[0].probs(scores)  # the batch's, on the CPU in one copy
        chosen = torch.full_like(scores, float("-inf"))
        for row, sampling in enumerate(self.samplings):
            chosen[row, sampling.draw(probs[row])] = 0.0
        return chosen


@torch.no_grad()
def generate(model: torch.nn.Module, eos: Sequence[int], settings: Regeneration, prompts: Sequence[Sequence[int]],
             budgets: Sequence[int], first_index: int, tick: Tick | None = None) -> list[Generation]:
    """Each prompt's response by `model` in process, from one batched `generate` call (prompt i's draws seeded by
    first_index + i); `tick` hears of the tokens of every step."""
    from transformers import GenerationConfig, LogitsProcessorList

    device = next(model.parameters()).device
    pad = eos[0] if eos else 0  # what follows a finished row; never read
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=device)
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    config = GenerationConfig(do_sample=False, max_new_tokens=max(budgets), eos_token_id=list(eos) or None,
                              pad_token_id=pad)
    processors = LogitsProcessorList([_Ticker(tick, eos)] if tick is not None else [])
    if settings.temperature > 0:
        processors.append(_RowSampler([Sampling(settings.temperature, row_seed(settings.seed, first_index + i))
                                       for i in range(len(prompts))]))
    out = model.generate(input_ids=ids, attention_mask=attention, generation_config=config,
                         logits_processor=processors)[:, width:].tolist()
    return [_cut(tokens[:budget], set(eos), budget) for tokens, budget in zip(out, budgets)]


def _cut(tokens: list[int], eos: set[int], budget: int) -> Generation:
    for i, token in enumerate(tokens):
        if token in eos:
            return Generation(tokens[:i + 1], truncated=False)
    return Generation(tokens, truncated=len(tokens) == budget)


def regenerate(batches: BatchGenerator, prompts: Sequence[list[int]], settings: Regeneration, chunks_dir: Path,
               positions: int | None) -> list[Generation]:
    """Every prompt's response, one batch at a time (`batches(prompts, budgets, first index, tick=...)`: in process
    or by vLLM), with a bar on stderr (prompts, tokens generated, tokens/s, time left); each batch saved in
    `chunks_dir` as it is done, and a batch saved there before (by a run that stopped) read back instead of
    generated again."""
    refuse_links_in(chunks_dir.parent, chunks_dir, "the regenerated responses")
    chunks_dir.mkdir(parents=True, exist_ok=True)
    bs = settings.batch_size
    generations: list[Generation] = []
    bar = tqdm(total=len(prompts), desc="regenerating responses", unit="prompt", file=sys.stderr, dynamic_ncols=True,
               mininterval=1.0)
    tokens, start, lock = 0, time.perf_counter(), threading.Lock()

    def tick(n: int) -> None:  # from vLLM's request threads too
        nonlocal tokens
        with lock:
            tokens += n
            bar.set_postfix_str(f"{tokens} tokens, {tokens / max(time.perf_counter() - start, 1e-9):.1f} tokens/s")

    for first in range(0, len(prompts), bs):
        batch = prompts[first:first + bs]
        file = chunks_dir / f"chunk-{first:09d}.json"
        if file.is_file():
            chunk = [Generation(**g) for g in json.loads(file.read_text())]
        else:
            budgets = [settings.max_new_tokens if positions is None else min(settings.max_new_tokens,
                                                                              positions - len(p)) for p in batch]
            chunk = batches(batch, budgets, first, tick=tick)
            write_chunk(file, chunk)
        generations.extend(chunk)
        bar.update(len(batch))
    bar.close()
    return generations


def write_chunk(file: Path, chunk: Sequence[Generation]) -> None:
    """A finished batch's responses, renamed into place: a crash never leaves half a chunk."""
    write_text(file.parent, file, json.dumps([asdict(g) for g in chunk]))


def generation_counts(generations: Sequence[Generation], eos: Sequence[int]) -> dict[str, Any]:
    """What the data record says of the responses: how many stopped short of an end-of-sequence token, and how
    many are empty (the end-of-sequence token and nothing before it)."""
    return {"responses": len(generations), "tokens": sum(len(g.ids) for g in generations),
            "truncated": sum(g.truncated for g in generations),
            "empty": sum(len(g.ids) == 1 and g.ids[0] in eos for g in generations),
            "eos_token_ids": list(eos)}


def weights_stamp(verifier_dir: Path) -> list[tuple[str, int, int]]:
    """The verifier's weight files by name, size and modification time: two verifiers of the same config.json
    (the tiny one and its derived sibling) write other responses."""
    return [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(Path(verifier_dir).glob("*.safetensors"))]


def regenerated_rows_dir(data: RegenerateDataConfig, verifier_dir: Path, cache_dir: str,
                         device: str | torch.device = "cpu") -> Path:
    """The dir of Arrow rows (prompt ids mask 0, the verifier's response mask 1; each cut to data.max_len tokens)
    and token_freq.pt regenerated as data.regenerate says from the prompt set at data.path (its first
    data.max_records records, read as data.format, those over data.max_chars left out), built into the cache on
    first use (data=online's token rows format)."""
    from eagle3.data.token_rows import ROWS_RECORD, save_rows, tokenizer_hash
    from eagle3.formats.row_files import source_sha256

    path = Path(data.path)
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    settings = with_engine(data.regenerate)  # the rows are keyed by the engine that writes them, never by "auto"
    vllm = settings.engine == RegenerationEngine.vllm
    if vllm:
        from eagle3.data.regenerate_vllm import engine_dtype
    verifier = Verifier(verifier_dir)
    fingerprint = verifier.fingerprint()
    params = {"prompts_sha256": source_sha256(path), "verifier": fingerprint["config_hash"],
              "verifier_dir": str(Path(verifier_dir).resolve()), "weights": weights_stamp(verifier_dir),
              "tokenizer": tokenizer_hash(verifier_dir), "regenerate": asdict(settings),
              "on_bad_sample": data.on_bad_sample.value, "device": "vllm" if vllm else torch.device(device).type,
              "dtype": engine_dtype() if vllm else str(dtype),
              **({"format": data.format.value} if data.format != RowFormat.auto else {}),
              **({"max_records": data.max_records} if data.max_records is not None else {}),
              **({"max_chars": data.max_chars} if data.max_chars is not None else {}),
              **({"max_len": data.max_len} if data.max_len is not None else {})}
    target = Path(cache_dir) / "datasets" / f"regen-{cache_key(params)}"
    chunks_dir = target.with_name(f"{target.name}.chunks")

    def build(out: Path) -> None:
        bad = BadSamples(data.on_bad_sample.value)
        positions, eos = verifier.positions, verifier.eos_ids()
        prompts, row_format_record = read_prompts(path, verifier_dir, fingerprint["vocab_size"], bad, data.format,
                                                 data.max_records, data.max_chars)
        prompts = _with_room(prompts, positions, path, bad, data.max_len)
        resumed = chunks_dir.is_dir() and any(chunks_dir.glob("chunk-*.json"))  # its rate would count read chunks
        if vllm:
            from eagle3.data.regenerate_vllm import served

            chunks_dir.mkdir(parents=True, exist_ok=True)
            with served(verifier_dir, settings, chunks_dir / "vllm.log") as batches:
                start = time.perf_counter()
                generations = regenerate(batches, prompts, settings, chunks_dir, positions)
        else:
            model = verifier.load(device, dtype)
            start = time.perf_counter()
            generations = regenerate(partial(generate, model, eos, settings), prompts, settings, chunks_dir,
                                     positions)
        took, tokens = time.perf_counter() - start, sum(len(g.ids) for g in generations)
        if took > 0 and tokens and not resumed:  # the plan's expected regeneration time (eagle3.plan.roofline)
            _remember_rate(cache_dir, device, settings, fingerprint["config_hash"], tokens / took)
        rows = [(p + g.ids, [0] * len(p) + [1] * len(g.ids)) for p, g in zip(prompts, generations)]
        save_rows(cut_rows(rows, data.max_len, bad), out)
        record = {"format": 1, "source": str(path.resolve()), **params, **row_format_record, **bad.as_dict(),
                  "generation": generation_counts(generations, eos)}
        write_text(out, out / ROWS_RECORD, json.dumps(record, indent=2) + "\n")

    rows_dir = build_once(target, build, what="regenerated responses")
    shutil.rmtree(chunks_dir, ignore_errors=True)  # the rows are in place: the chunks they came from are not needed
    return rows_dir


def cut_rows(rows: list[tuple[list[int], list[int]]], max_len: int | None,
             bad: BadSamples) -> list[tuple[list[int], list[int]]]:
    """`rows` (ids, loss mask) cut to `max_len` tokens (None: as they are), the rows cut counted in `bad`."""
    bad.truncated += sum(max_len is not None and len(ids) > max_len for ids, _ in rows)
    return [(ids[:max_len], mask[:max_len]) for ids, mask in rows]


def _remember_rate(cache_dir: str, device: str | torch.device, settings: Regeneration, verifier_hash: str,
                   tokens_per_s: float) -> None:
    """This machine's regeneration rate for this verifier and engine, which the plan's time estimate reads."""
    from eagle3.plan.roofline import record_rate, regeneration_key

    record_rate(Path(cache_dir), torch.device(device).type, regeneration_key(settings.engine.value, verifier_hash),
                tokens_per_s)


def with_engine(settings: Regeneration) -> Regeneration:
    """`settings` with engine=auto resolved: vllm when eagle3.serve's engine environment is there (its default
    venv, or $EAGLE3_VLLM_PYTHON) and has vLLM, else transformers; the choice and why go to the log."""
    if settings.engine != RegenerationEngine.auto:
        return settings
    from eagle3.engine.venv import engine_python
    from eagle3.errors import EngineError

    try:
        engine = engine_python()
    except EngineError as e:
        log.info("regenerating with transformers' generate in this process (data.regenerate.engine=auto: %s)", e)
        return replace(settings, engine=RegenerationEngine.transformers)
    log.info("regenerating with vLLM %s %s from %s (data.regenerate.engine=auto: its engine environment is there; "
             "data.regenerate.engine=transformers generates in this process instead)", engine.name, engine.version,
             engine.python)
    return replace(settings, engine=RegenerationEngine.vllm)


def _with_room(prompts: list[list[int]], positions: int | None, path: Path, bad: BadSamples,
               max_len: int | None = None) -> list[list[int]]:
    """The prompts that leave the verifier a position to generate into, and a response token within data.max_len
    (a row is cut to it: a longer prompt would be generated for and then cut to no loss token); the others are bad
    samples, found before anything is generated."""
    kept = []
    for number, prompt in enumerate(prompts, start=1):
        if not prompt:
            bad.bad(f"{path}: prompt {number}", "empty_prompt", "a response with no token before it to continue")
        elif positions is not None and len(prompt) >= positions:
            bad.bad(f"{path}: prompt {number}", "prompt_too_long",
                    f"{len(prompt)} tokens leave no room for a response within the verifier's "
                    f"{positions} positions")
        elif max_len is not None and len(prompt) >= max_len:
            bad.bad(f"{path}: prompt {number}", "prompt_too_long",
                    f"{len(prompt)} tokens leave no response token within data.max_len={max_len}, to which "
                    "each row is cut")
        else:
            kept.append(prompt)
    if not kept:
        raise DataError(f"{path}: no prompt to regenerate a response for ({dict(bad.skipped)} skipped)")
    return kept
