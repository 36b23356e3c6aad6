"""Training rows from a JSONL file: `{"input_ids", "loss_mask"}` rows as they are, or chat `messages`
tokenized with the verifier's tokenizer and chat template (the assistant turns are the loss mask).

A bad row is never passed on silently: under `on_bad_sample=error` it stops the preparation with its line
number, under `skip` it is left out and counted. Rows longer than `max_len` are truncated and counted.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3.config import BadSamplePolicy, path_kind
from eagle3.errors import DataError

Row = tuple[list[int], list[int]]  # (input_ids, loss_mask)


class BadSamples:
    """What happened to rows that could not be used as they were: an error, or counted skips."""

    def __init__(self, policy: BadSamplePolicy | str):
        self.policy = BadSamplePolicy(policy)  # its names are checked where it is declared (data.on_bad_sample)
        self.skipped: Counter[str] = Counter()
        self.examples: list[str] = []
        self.truncated = 0

    def bad(self, where: str, kind: str, detail: str) -> None:
        if self.policy == "error":
            raise DataError(f"{where}: {detail} (on_bad_sample=skip leaves such rows out and counts them)")
        self.skipped[kind] += 1
        if len(self.examples) < 5:
            self.examples.append(f"{where}: {detail}")

    def as_dict(self) -> dict[str, Any]:
        return {"skipped": dict(self.skipped), "skipped_examples": self.examples, "truncated": self.truncated}


def read_rows(path: Path, max_len: int, vocab_size: int, bad: BadSamples,
              tokenize_chat: Callable[[list[dict[str, Any]]], Row] | None = None,
              empty_mask_rule: str = "") -> list[Row]:
    """The usable rows of a JSONL file, in file order. `tokenize_chat` is needed only for `messages` rows;
    `empty_mask_rule`, the reader's rule that a row whose loss mask is all 0 breaks, is added to its message."""
    if not path.is_file():
        raise DataError(f"{path} {path_kind(path, 'a regular file')}; expected a JSONL file of {{\"input_ids\", "
                        f"\"loss_mask\"}} or {{\"messages\"}} rows")
    rows: list[Row] = []
    with open(path, "rb") as f:  # decoded line by line: text that is not UTF-8 is a bad row with its line number
        for number, raw in enumerate(f, start=1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                bad.bad(where, "not_utf8", f"not UTF-8 text ({e.reason} at byte {e.start} of the line)")
                continue
            if not line.strip():
                continue
            row = _parse(line, where, bad, tokenize_chat)
            if row is None:
                continue
            ids, mask = row
            if len(ids) > max_len:
                ids, mask = ids[:max_len], mask[:max_len]
                bad.truncated += 1
            out_of_vocab = [t for t in ids if not 0 <= t < vocab_size]
            if out_of_vocab:
                bad.bad(where, "token_out_of_vocab", f"token id {out_of_vocab[0]} is outside the verifier's "
                                                     f"vocabulary of {vocab_size}")
            elif not any(mask):
                bad.bad(where, "empty_loss_mask", "no token to train on (loss_mask is all 0"
                                                  + (" after truncation to max_len)" if len(row[0]) > max_len else ")")
                                                  + (f"; {empty_mask_rule}" if empty_mask_rule else ""))
            else:
                rows.append((ids, mask))
    if not rows:
        skipped = f" ({sum(bad.skipped.values())} rows skipped: {dict(bad.skipped)})" if bad.skipped else ""
        raise DataError(f"{path} holds no usable rows{skipped}")
    return rows


def _parse(line: str, where: str, bad: BadSamples, tokenize_chat) -> Row | None:
    try:
        item = json.loads(line)
    except ValueError as e:
        bad.bad(where, "not_json", f"not a JSON object ({e})")
        return None
    if isinstance(item, dict) and "input_ids" in item:
        ids, mask = item["input_ids"], item.get("loss_mask")
        if not (_ints(ids) and _ints(mask) and mask is not None and len(ids) == len(mask) and ids):
            bad.bad(where, "malformed", "input_ids and loss_mask must be non-empty lists of integers of equal length")
            return None
        return list(ids), [int(m != 0) for m in mask]
    if isinstance(item, dict) and isinstance(item.get("messages"), list):
        if tokenize_chat is None:
            raise DataError(f"{where}: a messages row, but the verifier has no tokenizer with a chat template; "
                              f"give input_ids and loss_mask instead")
        try:
            return tokenize_chat(item["messages"])
        except ValueError as e:
            bad.bad(where, "chat_template", str(e))
            return None
    bad.bad(where, "malformed", "expected {\"input_ids\": [...], \"loss_mask\": [...]} or {\"messages\": [...]}")
    return None


def _ints(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


class ChatTokenizer:
    """Tokenizes a conversation with the model's chat template; the loss mask covers what each assistant turn
    adds to the rendered conversation (its content and end-of-turn tokens), found by rendering the prefix up
    to the turn with the generation prompt and the prefix including it."""

    def __init__(self, model_dir: Path):
        from transformers import AutoTokenizer

        from eagle3.data.verifier_forward import load_problem

        try:
            # Code in the dir (a tokenizer class of its own, named by auto_map) is never run.
            self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
        except (OSError, ValueError) as e:
            has_files = any(p.name.startswith("tokenizer") for p in Path(model_dir).iterdir())
            reason = load_problem(e) if has_files else "no tokenizer files in the dir"
            raise DataError(f"{model_dir}: messages rows need the model's tokenizer, which did not load ({reason}); "
                              f"give input_ids rows instead") from None
        if not self.tokenizer.chat_template:
            raise DataError(f"{model_dir}: its tokenizer has no chat template, so messages rows cannot be "
                              f"rendered; give input_ids rows instead")

    def render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        """The conversation's token ids as the chat template renders it (`generation_prompt`: ready for the
        assistant's next turn)."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def __call__(self, messages: list[dict[str, Any]]) -> Row:
        if not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
            raise ValueError("every message needs a role and a content")
        ids = self.render(messages, False)
        mask = [0] * len(ids)
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self.render(messages[:i], True) if i else []
            through = self.render(messages[:i + 1], False)
            if ids[:len(before)] != before or ids[:len(through)] != through:
                raise ValueError(f"the chat template renders turn {i} differently once later turns follow, so its "
                                 f"tokens cannot be located")
            mask[len(before):len(through)] = [1] * (len(through) - len(before))
        return ids, mask
