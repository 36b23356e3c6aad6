"""Prompts for the acceptance measurement: a JSONL file, or the prompts of a dataset's val split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eagle3.config import ConfigError


def read_jsonl_prompts(path: str | Path, verifier_dir: str | Path, limit: int | None = None) -> list[list[int]]:
    """Rows `{"input_ids": [...]}` (token ids as they are) or `{"messages": [...]}` (rendered with the chat
    template of the tokenizer in `verifier_dir`, with the generation prompt appended)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompts: {path} does not exist or is not a file")
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"prompts: {path} line {n} is not JSON ({e})") from None
        if not isinstance(row, dict) or ("input_ids" in row) == ("messages" in row):
            raise ConfigError(f"prompts: {path} line {n} must be an object with exactly one of input_ids and messages")
        rows.append(row | {"line": n})
    if not rows:
        raise ConfigError(f"prompts: {path} holds no prompts")
    rows = rows[:limit] if limit else rows
    tokenizer = chat_tokenizer(verifier_dir) if any("messages" in r for r in rows) else None
    return [_prompt_ids(row, tokenizer, path) for row in rows]


def _prompt_ids(row: dict[str, Any], tokenizer, path: Path) -> list[int]:
    where = f"prompts: {path} line {row['line']}"
    if "input_ids" in row:
        ids = row["input_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ConfigError(f"{where}: input_ids must be a non-empty list of integer token ids")
        return ids
    try:
        ids = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
    except Exception as e:  # noqa: BLE001  (jinja and tokenizers raise many types for bad messages)
        raise ConfigError(f"{where}: the chat template cannot render these messages ({type(e).__name__}: {e})") from None
    return list(ids)


def chat_tokenizer(verifier_dir: str | Path):
    """The verifier's tokenizer, which must carry a chat template to render `messages` rows."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(verifier_dir))
    except (OSError, ValueError) as e:
        raise ConfigError(f"prompts with messages need a tokenizer, and {verifier_dir} has none that loads "
                          f"({type(e).__name__}); give token ids as input_ids rows instead") from None
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"prompts with messages need a chat template, and the tokenizer in {verifier_dir} has "
                          "none; give token ids as input_ids rows instead")
    return tokenizer


def val_split_prompts(data_dir: str | Path, train_ratio: float, limit: int) -> list[list[int]]:
    """The loss-masked-out start of each val row (the prompt before the first trained token), in order, for
    the first `limit` rows that have one. The split is speculators' own (ArrowDataset), so it is training's."""
    from speculators.train.data import ArrowDataset

    try:
        rows = ArrowDataset(max_len=1 << 30, datapath=str(data_dir), on_missing="raise", train_ratio=train_ratio,
                            split="val").data
    except (OSError, ValueError, FileNotFoundError) as e:
        raise ConfigError(f"cannot read the val split of {data_dir} ({type(e).__name__}: {e})") from None
    prompts = []
    for row in rows:
        mask = row["loss_mask"].tolist()
        start = next((i for i, m in enumerate(mask) if m), len(mask))
        if 0 < start < len(mask):  # a prompt, and something after it that training learned to continue
            prompts.append(row["input_ids"][:start].tolist())
        if len(prompts) == limit:
            break
    if not prompts:
        raise ConfigError(f"no val row of {data_dir} starts with loss-masked prompt tokens; give a prompts file")
    return prompts
