"""Training rows from a data file (any eagle3.formats.row_files reads: JSONL, a JSON array, Parquet, a `datasets`
dir), in one of three formats (data.format; auto: the first row's, recorded with the rows):

    tokens      {"input_ids": [...], "loss_mask": [...]}                  as they are (speculators' rows)
    messages    {"messages": [{"role", "content"}, ...]}                   OpenAI's chat format
    sharegpt    {"id", "conversations": [{"from", "value"}, ...]}          ShareGPT's: from human|user, gpt|assistant,
                                                                            system

A conversation is tokenized with the verifier's tokenizer and chat template (`ChatTokenizer`); the loss mask is
every assistant turn's tokens, its end-of-turn token included.

A bad row is never passed on silently: under `on_bad_sample=error` it stops the preparation with its line or
record number, under `skip` it is left out and counted. A row of another format than the rows', a speaker or
role no chat template knows, a file cut inside a record are bad rows. Rows longer than `max_len` are truncated
and counted.

Entry points: `read_rows` (training rows: prepare, data=online, data=regenerate's prompt set), `conversation` +
`ChatTokenizer` (one conversation's row or prompt), eagle3.eval.prompts.read_prompts_file (eval.accept's and
serve's prompts), eagle3.formats.row_files.records (a file's raw records, e.g. to take a slice of a large one).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from eagle3.config import ROWS_FILES, BadSamplePolicy, RowFormat, path_kind
from eagle3.errors import DataError
from eagle3.formats.row_files import Unreadable, records

Row = tuple[list[int], list[int]]  # (input_ids, loss_mask)


@dataclass(frozen=True)
class Options:
    """How messages name the options the reading follows: a run's config keys, or prepare's flags (PREPARE)."""

    skip: str = "on_bad_sample=skip"
    format: str = "data.format"


PREPARE = Options(skip="--on-bad-sample skip", format="--format")


class BadSamples:
    """What happened to rows that could not be used as they were: an error, or counted skips. `options`: how the
    messages name the options (a run's keys by default)."""

    def __init__(self, policy: BadSamplePolicy | str, options: Options = Options()):
        self.policy = BadSamplePolicy(policy)  # its names are checked where it is declared (data.on_bad_sample)
        self.options = options
        self.skipped: Counter[str] = Counter()
        self.examples: list[str] = []
        self.truncated = 0
        self.over_max_chars = 0  # conversations left out by max_chars (a selection, not bad rows)

    def bad(self, where: str, kind: str, detail: str) -> None:
        if self.policy == "error":
            raise DataError(f"{where}: {detail} ({self.options.skip} leaves such rows out and counts them)")
        self.skipped[kind] += 1
        if len(self.examples) < 5:
            self.examples.append(f"{where}: {detail}")

    def as_dict(self) -> dict[str, Any]:
        return {"skipped": dict(self.skipped), "skipped_examples": self.examples, "truncated": self.truncated,
                **({"over_max_chars": self.over_max_chars} if self.over_max_chars else {})}


FORMAT_KEYS = {RowFormat.tokens: "input_ids", RowFormat.messages: "messages", RowFormat.sharegpt: "conversations"}
# ShareGPT's speakers as chat templates name them
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")


class RowProblem(ValueError):
    """Why a row cannot be used, with the bad-row counter it goes to."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind


class Rows(list[Row]):
    """The usable rows of a file, in file order, and the format they were read in."""

    format: RowFormat
    format_from: str  # "set" (data.format, --format), or the row it was detected from

    def record(self) -> dict[str, str]:
        """What the rows' record (eagle3_rows.json, eagle3_data.json) says about their format."""
        return {"row_format": self.format.value, "row_format_from": self.format_from}


class Formats:
    """The format of a file's rows: the one set (data.format, --format: `key`), or with `auto` the first row's."""

    def __init__(self, setting: RowFormat | str = RowFormat.auto, key: str = Options.format):
        self.format: RowFormat | None = None if RowFormat(setting) == RowFormat.auto else RowFormat(setting)
        self.format_from = "" if self.format is None else "set"
        self.key = key

    def of(self, item: Any, where: str) -> RowFormat:
        """The format of the row `item` (at `where`), which must be the rows' format."""
        found = next((f for f, key in FORMAT_KEYS.items() if isinstance(item, dict) and key in item), None)
        if found is None:
            raise RowProblem("malformed", 'expected {"input_ids": [...], "loss_mask": [...]}, {"messages": [...]} or '
                                          '{"conversations": [...]} (ShareGPT)')
        if self.format is None:
            self.format, self.format_from = found, f"detected from the first row ({where})"
        elif found != self.format:
            source = f"set by {self.key}" if self.format_from == "set" else self.format_from
            raise RowProblem("other_format", f"a {found.value} row among {self.format.value} rows (the format was "
                                             f"{source})")
        return found


def conversation(item: dict[str, Any], form: RowFormat) -> list[dict[str, str]]:
    """A messages or ShareGPT row as chat messages [{"role", "content"}], checked; ShareGPT's speakers renamed."""
    turns = item[FORMAT_KEYS[form]]
    if not isinstance(turns, list):
        raise RowProblem("malformed", f"{FORMAT_KEYS[form]} must be a list of turns")
    if not turns:
        raise RowProblem("empty_loss_mask", f"an empty conversation ({FORMAT_KEYS[form]} has no turn)")
    role_key, text_key = ("role", "content") if form == RowFormat.messages else ("from", "value")
    messages = []
    for i, turn in enumerate(turns, start=1):  # numbered from 1, as records and lines are
        if not (isinstance(turn, dict) and isinstance(turn.get(role_key), str) and isinstance(turn.get(text_key), str)):
            raise RowProblem("malformed", f"turn {i} needs a {role_key} and a text {text_key}")
        role = turn[role_key]
        if form == RowFormat.sharegpt:
            if role not in SHAREGPT_ROLES:
                raise RowProblem("unknown_role", f"turn {i} is from {role!r}; ShareGPT speakers are "
                                                 f"{', '.join(SHAREGPT_ROLES)}")
            role = SHAREGPT_ROLES[role]
        elif role not in MESSAGE_ROLES:
            raise RowProblem("unknown_role", f"turn {i} has the role {role!r}; roles are {', '.join(MESSAGE_ROLES)}")
        messages.append({"role": role, "content": turn[text_key]})
    return messages


def read_rows(path: Path, max_len: int, vocab_size: int, bad: BadSamples,
              tokenize_chat: Callable[[list[dict[str, Any]]], Row] | None = None,
              row_format: RowFormat | str = RowFormat.auto, empty_mask_rule: str = "",
              max_records: int | None = None, max_chars: int | None = None) -> Rows:
    """The usable rows of a rows file or `datasets` dir (eagle3.formats.row_files), in file order, in `row_format`
    (auto: the first row's). `tokenize_chat` is needed only for conversations (messages and ShareGPT rows);
    `empty_mask_rule`, the reader's rule that a row whose loss mask is all 0 breaks, is added to its message.
    `max_records`: only the file's first records are read (bad ones counted among them), never the rest of it.
    `max_chars`: conversations whose turns hold more characters in all are left out untokenized, counted in
    `bad.over_max_chars` (token rows, which have no characters, are refused)."""
    if not (path.is_file() or path.is_dir()):
        raise DataError(f"{path} {path_kind(path, 'a regular file')}; expected {ROWS_FILES}")
    formats = Formats(row_format, bad.options.format)
    rows = Rows()
    for where, item in islice(records(path), max_records):
        if isinstance(item, Unreadable):
            bad.bad(where, item.kind, item.detail)
            continue
        try:
            row = _parse(item, where, formats, tokenize_chat, max_chars)
        except RowProblem as e:
            bad.bad(where, e.kind, str(e))
            continue
        if row is None:
            bad.over_max_chars += 1
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
        if bad.over_max_chars:
            skipped += f" ({bad.over_max_chars} conversations longer than data.max_chars={max_chars} characters)"
        raise DataError(f"{path} holds no usable rows{skipped}")
    assert formats.format is not None  # a row was read
    rows.format, rows.format_from = formats.format, formats.format_from
    return rows


def _ints(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _parse(item: Any, where: str, formats: Formats, tokenize_chat, max_chars: int | None = None) -> Row | None:
    """The row `item` as (input_ids, loss_mask); None for a conversation longer than `max_chars` characters."""
    form = formats.of(item, where)
    if form == RowFormat.tokens:
        if max_chars is not None:
            raise DataError(f"{where}: a token row, and data.max_chars={max_chars} selects conversations by their "
                            f"characters; token rows have none: drop data.max_chars (data.max_chars=null)")
        ids, mask = item["input_ids"], item.get("loss_mask")
        if not (_ints(ids) and _ints(mask) and mask is not None and len(ids) == len(mask) and ids):
            raise RowProblem("malformed", "input_ids and loss_mask must be non-empty lists of integers of equal length")
        other = next((m for m in mask if m not in (0, 1)), None)
        if other is not None:  # -100 is Hugging Face's ignore label, not a mask value: none is guessed at
            raise RowProblem("bad_loss_mask", f"loss_mask holds {other} at position {mask.index(other)}; its values "
                                              f"are 1 (trained) and 0 (not trained)")
        return list(ids), list(mask)
    messages = conversation(item, form)
    if max_chars is not None and sum(len(m["content"]) for m in messages) > max_chars:
        return None
    if tokenize_chat is None:
        raise DataError(f"{where}: a conversation, but the verifier has no tokenizer with a chat template; "
                        f"give input_ids and loss_mask instead")
    try:
        return tokenize_chat(messages)
    except ValueError as e:
        raise RowProblem("chat_template", str(e)) from None


class ChatTokenizer:
    """Tokenizes a conversation with the model's chat template; the loss mask covers what each assistant turn
    adds to the rendered conversation (its content and end-of-turn tokens), found by rendering the prefix up
    to the turn with the generation prompt and the prefix including it. What a template adds of its own (a
    default system prompt when there is no system turn, as SmolLM2's and Qwen's insert) is in both renderings,
    so it stays out of the mask, also before a conversation's first turn; what follows a turn's end-of-sequence
    token (the newline after `<|im_end|>`) is the template's, and stays out too. Built by
    eagle3.verifier.model.Verifier.chat_tokenizer from the verifier's tokenizer (`model_dir`: where it is)."""

    def __init__(self, tokenizer, model_dir: Path):
        self.tokenizer = tokenizer
        if not self.tokenizer.chat_template:
            raise DataError(f"{model_dir}: its tokenizer has no chat template, so conversations (messages or "
                            f"ShareGPT rows) cannot be rendered; give input_ids rows instead")
        self.eos = self.tokenizer.eos_token_id

    def render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        """The conversation's token ids as the chat template renders it (`generation_prompt`: ready for the
        assistant's next turn). A conversation the template refuses (one that raises, e.g. roles that must
        alternate) is a ValueError."""
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=generation_prompt)
        except Exception as e:  # noqa: BLE001  (jinja and the template's raise_exception raise many types)
            raise ValueError(f"the chat template cannot render it ({type(e).__name__}: {e})") from None
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        """A conversation's prompt: its turns before its first assistant turn that has a turn before it (all of
        them when there is none), with the generation prompt, as the verifier would be asked to answer it."""
        first = next((i for i, m in enumerate(messages) if i and m["role"] == "assistant"), len(messages))
        if first == 0:
            raise ValueError("no turn to answer")
        return self.render(messages[:first], True)

    def __call__(self, messages: list[dict[str, Any]]) -> Row:
        if not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
            raise ValueError("every message needs a role and a content")
        ids = self.render(messages, False)
        mask = [0] * len(ids)
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            through = self.render(messages[:i + 1], False)
            before = self.render(messages[:i], True) if i else self._header(message, through)
            if ids[:len(before)] != before or ids[:len(through)] != through or len(before) > len(through):
                raise ValueError(f"the chat template renders turn {i + 1} differently once later turns follow, so its "
                                 f"tokens cannot be located")
            end = len(through)
            if self.eos is not None and self.eos in through[len(before):]:
                end = len(through) - through[::-1].index(self.eos)  # through the turn's last end-of-sequence token
            mask[len(before):end] = [1] * (end - len(before))
        return ids, mask

    def _header(self, message: dict[str, Any], through: list[int]) -> list[int]:
        """What the template renders before a first turn's content when that turn is the assistant's (a default
        system prompt, the turn's header): the tokens it shares with the same turn left empty."""
        empty = self.render([{**message, "content": ""}], False)
        shared = next((i for i, (a, b) in enumerate(zip(empty, through)) if a != b), min(len(empty), len(through)))
        return through[:shared]
