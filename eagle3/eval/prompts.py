"""Prompts for the acceptance measurement: a JSONL file, or the prompts of a dataset's val split."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from eagle3.data.jsonl import ChatTokenizer
from eagle3.errors import DataError


class Prompt(list[int]):
    """A prompt's token ids and where it came from, which messages about it name ("<file> line 3", "val row 57")."""

    def __init__(self, ids: Iterable[int], where: str):
        super().__init__(ids)
        self.where = where


def read_jsonl_prompts(path: str | Path, verifier_dir: str | Path, limit: int | None = None) -> list[Prompt]:
    """Rows `{"input_ids": [...]}` (token ids as they are) or `{"messages": [...]}` (rendered with the chat
    template of the tokenizer in `verifier_dir`, with the generation prompt appended)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"prompts: {path} does not exist or is not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        bad_line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise DataError(f"prompts: {path} line {bad_line} is not UTF-8 text ({e.reason} at byte {e.start}); a prompts "
                        f"file is a UTF-8 JSONL") from None
    except OSError as e:
        raise DataError(f"prompts: {path} cannot be read ({e.strerror})") from None
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"prompts: {path} line {n} is not JSON ({e})") from None
        if not isinstance(row, dict) or ("input_ids" in row) == ("messages" in row):
            raise DataError(f"prompts: {path} line {n} must be an object with exactly one of input_ids and messages")
        rows.append(row | {"line": n})
    if not rows:
        raise DataError(f"prompts: {path} holds no prompts")
    rows = rows[:limit] if limit else rows
    tokenizer = ChatTokenizer(Path(verifier_dir)) if any("messages" in r for r in rows) else None
    return [Prompt(_prompt_ids(row, tokenizer, path), f"prompts: {path} line {row['line']}") for row in rows]


def _prompt_ids(row: dict[str, Any], tokenizer, path: Path) -> list[int]:
    where = f"prompts: {path} line {row['line']}"
    if "input_ids" in row:
        ids = row["input_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise DataError(f"{where}: input_ids must be a non-empty list of integer token ids")
        return ids
    try:
        ids = tokenizer.render(row["messages"], generation_prompt=True)
    except Exception as e:  # noqa: BLE001  (jinja and tokenizers raise many types for bad messages)
        raise DataError(f"{where}: the chat template cannot render these messages ({type(e).__name__}: {e})") from None
    return list(ids)


def val_split_prompts(data_dir: str | Path, train_ratio: float, limit: int) -> list[Prompt]:
    """The loss-masked-out start of each val row (the prompt before the first trained token), in order, for
    the first `limit` rows that have one. The split is training's (eagle3.data.loader: the rows from
    int(len * train_ratio) on)."""
    from eagle3.data.rows import ArrowRows

    try:
        rows = ArrowRows(data_dir)
    except Exception as e:  # noqa: BLE001  (datasets raises several types for a dir it cannot read)
        raise DataError(f"cannot read the val split of {data_dir} ({type(e).__name__}: {e})") from None
    prompts = []
    for i in range(int(len(rows) * train_ratio), len(rows)):
        mask = rows.loss_mask(i)
        start = int(mask.argmax()) if mask.any() else len(mask)
        if 0 < start < len(mask):  # a prompt, and something after it that training learned to continue
            prompts.append(Prompt(rows.input_ids(i)[:start].tolist(), f"val row {i} of {data_dir}"))
        if len(prompts) == limit:
            break
    if not prompts:
        raise DataError(f"no val row of {data_dir} starts with loss-masked prompt tokens; give a prompts file")
    return prompts
