"""The token rows online data reads (data=online): a dir of Arrow rows (input_ids, loss_mask, seq_len) with their
loss tokens' counts (token_freq.pt), which the draft vocabulary (d2t/t2d) is built from and cached next to.

    data.path = a speculators-     its Arrow rows (input_ids, loss_mask, seq_len), as they are (hidden states unread)
      format dataset dir
    data.path = a rows file or     {"input_ids", "loss_mask"}, {"messages"} or ShareGPT {"conversations"} rows in a
      another datasets dir         JSONL, JSON array, Parquet file or datasets dir, as eagle3.data.prepare reads
                                   them (eagle3.formats.row_formats), saved once under <cache_dir>/datasets/rows-<key
                                   of the file's bytes>
    data.path = null               sequences sampled from the verifier as data.synth says (the tiny default's: the
                                   same rows data=tiny trains on), saved under <cache_dir>/datasets/rows-<key>

No hidden state is computed or written here: eagle3/data/online.py computes them in the training loop.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3.config import RowFormat
from eagle3.errors import DataError
from eagle3.formats.cache import build_once, cache_key
from eagle3.formats.row_files import source_sha256
from eagle3.formats.row_formats import Row
from eagle3.safe_write import LinkRefused, replace_file, write_text
from eagle3.verifier.model import Verifier

if TYPE_CHECKING:
    from eagle3.config import OnlineDataConfig

log = logging.getLogger(__name__)

ROWS_RECORD = "eagle3_rows.json"  # where the rows came from, and the JSONL rows skipped on the way


def token_rows_dir(data: OnlineDataConfig, verifier_dir: Path, cache_dir: str) -> Path:
    """The dir of Arrow rows and token_freq.pt this online run reads, built into the cache on first use."""
    if data.path is not None and Path(data.path).is_dir() and speculators_rows(Path(data.path), data.format):
        refuse_row_selection_of_a_dataset_dir(data)
        return rows_with_counts(Path(data.path))
    given = Verifier(verifier_dir)
    verifier = given.fingerprint()
    if data.path is None:
        synth = data.synth
        params = {"verifier": verifier["config_hash"], "verifier_dir": str(verifier_dir), "synth": asdict(synth)}

        def sample(out: Path) -> None:
            from eagle3.data.sampling import sample_rows

            save_rows(sample_rows(given.load(), synth), out)
            _write_record(out, {"source": "sampled from the verifier", "synth": asdict(synth), "verifier": verifier})

        return build_once(Path(cache_dir) / "datasets" / f"rows-{cache_key(params)}", sample, what="token rows")

    jsonl = Path(data.path)
    policy = data.on_bad_sample.value
    params = {"jsonl_sha256": source_sha256(jsonl), "verifier": verifier["config_hash"],
              "tokenizer": tokenizer_hash(verifier_dir), "on_bad_sample": policy,
              **({"format": data.format.value} if data.format != RowFormat.auto else {}),
              **({"max_records": data.max_records} if data.max_records is not None else {}),
              **({"max_chars": data.max_chars} if data.max_chars is not None else {}),
              **({"max_len": data.max_len} if data.max_len is not None else {})}

    def read(out: Path) -> None:
        from eagle3.formats.row_formats import BadSamples, ChatTokenizer, read_rows

        chat: list[ChatTokenizer] = []  # built on the first messages row: input_ids rows need no tokenizer

        def tokenize_chat(messages: list[dict[str, Any]]) -> Row:
            if not chat:
                chat.append(given.chat_tokenizer())
            return chat[0](messages)

        bad = BadSamples(policy)
        # Cut at data.max_len alone: rows longer than the verifier's positions are the start-up check's to report.
        rows = read_rows(jsonl, data.max_len or sys.maxsize, verifier["vocab_size"], bad, tokenize_chat, data.format,
                         max_records=data.max_records, max_chars=data.max_chars)
        if bad.truncated:
            log.info("%s: %d rows cut to data.max_len=%d tokens", jsonl, bad.truncated, data.max_len)
        if bad.over_max_chars:
            log.info("%s: %d conversations longer than data.max_chars=%d characters left out (a selection, counted "
                     "in the rows' record as over_max_chars)", jsonl, bad.over_max_chars, data.max_chars)
        # The lines skipped are in the record: launch.check_data reports them at every run on these rows.
        save_rows(rows, out)
        _write_record(out, {"source": str(jsonl.resolve()), **params, **rows.record(), **bad.as_dict()})

    return build_once(Path(cache_dir) / "datasets" / f"rows-{cache_key(params)}", read, what="token rows")


def save_rows(rows: Sequence[Row], out_dir: Path) -> None:
    """`rows` as Arrow rows (input_ids, loss_mask, seq_len; torch format) and their loss tokens' counts."""
    from datasets import Dataset

    from eagle3.formats.vocab import TOKEN_FREQ, write_token_freq

    dataset = Dataset.from_dict({
        "input_ids": [ids for ids, _ in rows],
        "loss_mask": [mask for _, mask in rows],
        "seq_len": [len(ids) for ids, _ in rows],
    }).with_format("torch")
    dataset.save_to_disk(str(out_dir))
    write_token_freq(rows, out_dir / TOKEN_FREQ)


def refuse_row_selection_of_a_dataset_dir(data: OnlineDataConfig) -> None:
    """data.max_records bounds the records read from a rows file, data.max_chars selects its conversations and
    data.max_len cuts its rows: a speculators-format dataset dir's rows are read as they are, all of them (checked
    before the run dir is written: the launcher's refuse_early)."""
    given = [(key, does) for key, does in (("max_records", "bounds the records read from a rows file"),
                                           ("max_chars", "selects the conversations read from a rows file"),
                                           ("max_len", "cuts the rows read from a rows file"))
             if getattr(data, key) is not None]
    if not given or data.path is None or not Path(data.path).is_dir():
        return
    if speculators_rows(Path(data.path), data.format):
        key, does = given[0]
        raise DataError(f"data.{key}: {data.path} is a speculators-format dataset dir, whose rows are read as "
                        f"they are, all of them; drop data.{key} (it {does})")


def speculators_rows(data_dir: Path, row_format: RowFormat = RowFormat.auto) -> bool:
    """Whether the `datasets` dir holds speculators' token rows (input_ids, loss_mask, seq_len columns), read as
    they are; else its rows are read as any rows file's (conversations, or token rows without seq_len). A dir of
    token rows with data.format set to a conversation format is refused."""
    from eagle3.formats.row_files import dataset_table

    if not any(data_dir.glob("*.arrow")):
        return True  # rows_with_counts says what is missing
    try:
        columns = set(dataset_table(data_dir).column_names)
    except DataError as e:
        raise DataError(f"data.path: {e}") from None
    tokens = {"input_ids", "loss_mask"} <= columns
    if tokens and row_format not in (RowFormat.auto, RowFormat.tokens):
        raise DataError(f"data.path: {data_dir} holds token rows (input_ids, loss_mask), and data.format="
                        f"{row_format.value}: drop data.format, or set data.format=tokens")
    return tokens and "seq_len" in columns


def rows_with_counts(data_dir: Path) -> Path:
    """A user's dataset dir; its token_freq.pt is computed and written next to the rows when it has none (as
    speculators' pipeline writes it)."""
    if (data_dir / "token_freq.pt").is_file():  # formats.vocab's TOKEN_FREQ, without importing torch for it
        return data_dir
    from datasets import load_from_disk

    from eagle3.formats.vocab import TOKEN_FREQ, write_token_freq

    try:
        dataset = load_from_disk(str(data_dir))
    except Exception as e:  # noqa: BLE001  (datasets raises several types for a dir it cannot read)
        raise DataError(f"data.path: {data_dir} is not a dataset saved with datasets.save_to_disk ({e})") from None
    log.info("%s has no token_freq.pt: counting its loss tokens for the draft vocabulary", data_dir)
    batches = dataset.select_columns(["input_ids", "loss_mask"]).iter(batch_size=1024)  # not all in memory
    rows = ((ids, mask) for b in batches for ids, mask in zip(b["input_ids"], b["loss_mask"]))
    try:  # written beside and renamed into place: another rank or node never reads half of it
        replace_file(data_dir, data_dir / TOKEN_FREQ, partial(write_token_freq, rows), what=TOKEN_FREQ)
    except LinkRefused as e:
        raise DataError(f"data.path: {data_dir} has no token_freq.pt, and {e}") from None
    except (OSError, RuntimeError) as e:  # torch.save raises RuntimeError on a read-only file system
        raise DataError(f"data.path: {data_dir} has no token_freq.pt (the loss tokens' counts the draft vocabulary "
                        f"is built from) and it cannot be written there ({str(e).strip().splitlines()[0]}); make the "
                        f"dir writable once") from None
    return data_dir


def tokenizer_hash(verifier_dir: Path) -> str:
    """The tokenizer and chat template files' content: messages rows render through them."""
    digest = hashlib.sha256()
    for file in sorted(Path(verifier_dir).glob("*")):
        if file.is_file() and (file.name.startswith("tokenizer") or "chat_template" in file.name
                               or file.suffix in (".model", ".tiktoken")):
            digest.update(file.name.encode() + file.read_bytes())
    return digest.hexdigest()[:16]


def read_rows_record(rows_dir: Path) -> dict[str, Any] | None:
    """The token rows' record (where they came from, the JSONL lines skipped), None for a user's own dataset dir."""
    try:
        record = json.loads((rows_dir / ROWS_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _write_record(out_dir: Path, record: dict[str, Any]) -> None:
    write_text(out_dir, out_dir / ROWS_RECORD, json.dumps({"format": 1, **record}, indent=2) + "\n")
