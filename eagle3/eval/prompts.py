"""Prompts for the acceptance measurement: a rows file (any eagle3.data.prepare reads), or the prompts of a
dataset's val split."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from eagle3.config import RowFormat
from eagle3.errors import ConfigError, DataError
from eagle3.formats.row_files import Unreadable, records
from eagle3.formats.row_formats import ChatTokenizer, Formats, RowProblem, conversation
from eagle3.verifier.model import Verifier


class Prompt(list[int]):
    """A prompt's token ids and where it came from, which messages about it name ("prompts: <file>:3", "val row
    57")."""

    def __init__(self, ids: Iterable[int], where: str):
        super().__init__(ids)
        self.where = where


def read_prompts_file(path: str | Path, verifier_dir: str | Path, limit: int | None = None) -> list[Prompt]:
    """The first `limit` prompts (all without one) of a rows file or `datasets` dir (eagle3.formats.row_files reads
    them, one record at a time): `{"input_ids": [...]}` rows are token ids as they are (a loss_mask is not needed);
    a conversation (`{"messages"}` or ShareGPT's `{"conversations"}`, eagle3.formats.row_formats) is everything before
    its first assistant turn, rendered with the chat template of the tokenizer in `verifier_dir` with the generation
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
            chat.append(Verifier(verifier_dir).chat_tokenizer())
        return chat[0].prompt(messages)
    except ValueError as e:  # RowProblem, or the chat template's refusal
        raise DataError(f"prompts: {where}: {e}") from None


def val_split_prompts(data_dir: str | Path, train_ratio: float, limit: int) -> list[Prompt]:
    """The loss-masked-out start of each val row (the prompt before the first trained token), in order, for
    the first `limit` rows that have one. The split is training's (eagle3.data.loader: the rows from
    int(len * train_ratio) on)."""
    from eagle3.formats.arrow_rows import ArrowRows

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


def prompt_origin(prompt: Sequence[int], i: int) -> str:
    """Where a prompt came from: a file's line (1-based) or a val row, as read_prompts_file records it."""
    return getattr(prompt, "where", f"prompt {i + 1} (1-based)")


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int, max_positions: int | None, max_new_tokens: int,
                  k: int) -> None:
    """Every prompt's ids within the verifier's vocabulary, and the prompt, its `max_new_tokens` and the `k` draft
    tokens of the last verify step within its positions (max_position_embeddings; None: unbounded): what the
    harness decodes into and what an engine serving the verifier accepts. The first prompt that is not is a
    ConfigError naming where it came from."""
    if max_positions is not None and max_new_tokens + k >= max_positions:
        raise ConfigError(f"k={k} draft tokens and max_new_tokens={max_new_tokens} leave no room for a prompt in the "
                          f"verifier's max_position_embeddings ({max_positions}): k + max_new_tokens must be below "
                          "it")
    for i, p in enumerate(prompts):
        where = prompt_origin(p, i)
        if not p:
            raise ConfigError(f"{where}: the prompt is empty")
        bad = [t for t in p if not (isinstance(t, int) and 0 <= t < vocab_size)]
        if bad:
            raise ConfigError(f"{where}: token ids outside the verifier's vocabulary [0, {vocab_size}): {bad[:5]}")
        if max_positions is None:
            continue
        if len(p) >= max_positions:
            raise ConfigError(f"{where}: {len(p)} prompt tokens, as many as the verifier's {max_positions} positions "
                              "(max_position_embeddings) or more: no room for a response; shorten the prompt")
        if len(p) + max_new_tokens + k > max_positions:
            raise ConfigError(f"{where}: {len(p)} prompt tokens + max_new_tokens {max_new_tokens} + k {k} draft "
                              f"tokens pass the verifier's {max_positions} positions (max_position_embeddings): at "
                              f"most {max_positions - max_new_tokens - k} prompt tokens at this max_new_tokens")
