"""Prompts for the acceptance measurement: a rows file (any eagle3.data.prepare reads), or the prompts of a
dataset's val split."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from eagle3.config import RowFormat
from eagle3.data.jsonl import ChatTokenizer, Formats, RowProblem, conversation
from eagle3.data.row_files import Unreadable, records
from eagle3.errors import DataError


class Prompt(list[int]):
    """A prompt's token ids and where it came from, which messages about it name ("prompts: <file>:3", "val row
    57")."""

    def __init__(self, ids: Iterable[int], where: str):
        super().__init__(ids)
        self.where = where


def read_prompts_file(path: str | Path, verifier_dir: str | Path, limit: int | None = None) -> list[Prompt]:
    """The first `limit` prompts (all without one) of a rows file or `datasets` dir (eagle3.data.row_files reads
    them, one record at a time): `{"input_ids": [...]}` rows are token ids as they are (a loss_mask is not needed);
    a conversation (`{"messages"}` or ShareGPT's `{"conversations"}`, eagle3.data.jsonl) is everything before its
    first assistant turn, rendered with the chat template of the tokenizer in `verifier_dir` with the generation
    prompt. Every row must be in the first row's format; a bad row is an error naming it."""
    path = Path(path)
    if not (path.is_file() or path.is_dir()):
        raise DataError(f"prompts: {path} does not exist or is not a file")
    formats = Formats()
    chat: list[ChatTokenizer] = []  # built on the first conversation: token ids need no tokenizer
    prompts: list[Prompt] = []
    try:
        for where, item in records(path):
            if isinstance(item, Unreadable):
                raise DataError(f"prompts: {where}: {item.detail}")
            prompts.append(Prompt(_prompt_ids(item, where, formats, chat, Path(verifier_dir)), f"prompts: {where}"))
            if limit and len(prompts) == limit:
                break
    except OSError as e:
        raise DataError(f"prompts: {path} cannot be read ({e.strerror})") from None
    if not prompts:
        raise DataError(f"prompts: {path} holds no prompts")
    return prompts


def _prompt_ids(item: Any, where: str, formats: Formats, chat: list[ChatTokenizer], verifier_dir: Path) -> list[int]:
    try:
        form = formats.of(item, where)
        if form == RowFormat.tokens:
            ids = item["input_ids"]
            if not isinstance(ids, list) or not ids or \
                    not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise RowProblem("malformed", "input_ids must be a non-empty list of integer token ids")
            return ids
        messages = conversation(item, form)
        if not chat:
            chat.append(ChatTokenizer(verifier_dir))
        return chat[0].prompt(messages)
    except ValueError as e:  # RowProblem, or the chat template's refusal
        raise DataError(f"prompts: {where}: {e}") from None


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
