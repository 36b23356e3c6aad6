"""The files data rows come in, one reader per file format; what a row holds is eagle3/formats/row_formats.py's concern.

    a JSONL file            one JSON value per line                          "<file>:<line>"
    a JSON array file       `[{...}, {...}, ...]` (ShareGPT's), streamed     "<file>: record <n>"
    a Parquet file          by its `.parquet` suffix, in record batches      "<file>: row <n>"
    a `datasets` dir        saved with `datasets.save_to_disk`               "<dir>: row <n>"

`records(path)` yields each record in file order as (where, value): `where` names it in messages, `value` is the
parsed value, or an `Unreadable` saying why it could not be read (text that is not UTF-8, not JSON, a file cut
inside a record), which the caller's bad-row policy handles. A JSON array is read one record at a time, never
whole: ShareGPT V3 is a 125 MB array, and the copy in its PyPI wheel is cut mid-record; its complete records are
read, and the cut is one unreadable record after them.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.errors import DataError

CHUNK = 1 << 20  # characters of a JSON array read at a time


@dataclass
class Unreadable:
    """A record that could not be read: `kind` is the bad-row counter it goes to, `detail` the message."""

    kind: str
    detail: str


def file_kind(path: Path) -> str:
    """"dataset" (a dir), "parquet" (by suffix), "json_array" (its first non-blank character is `[`), else "jsonl"."""
    if path.is_dir():
        return "dataset"
    if path.suffix.lower() == ".parquet":
        return "parquet"
    with open(path, "rb") as f:
        head = f.read(4096).lstrip()
    return "json_array" if head.startswith(b"[") else "jsonl"


def records(path: Path) -> Iterator[tuple[str, Any]]:
    """Every record of the file or `datasets` dir at `path`, in order, as (where, value or Unreadable)."""
    kind = file_kind(path)
    return {"dataset": _dataset_records, "parquet": _parquet_records, "json_array": _json_array_records,
            "jsonl": _jsonl_records}[kind](path)


def _jsonl_records(path: Path) -> Iterator[tuple[str, Any]]:
    with open(path, "rb") as f:  # decoded line by line: text that is not UTF-8 is a bad row with its line number
        for number, raw in enumerate(f, start=1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield where, Unreadable("not_utf8", f"not UTF-8 text ({e.reason} at byte {e.start} of the line)")
                continue
            if not line.strip():
                continue
            try:
                yield where, json.loads(line)
            except ValueError as e:
                yield where, Unreadable("not_json", f"not a JSON object ({e})")


def _json_array_records(path: Path) -> Iterator[tuple[str, Any]]:
    with open(path, "rb") as f:
        yield from _ArrayStream(path, f).records()


class _ArrayStream:
    """The elements of a JSON array, decoded one at a time from a buffer refilled `CHUNK` characters at a time."""

    def __init__(self, path: Path, file):
        self.path, self.file = path, file
        self.text = codecs.getincrementaldecoder("utf-8")()
        self.decoder = json.JSONDecoder()
        self.buf, self.pos, self.eof, self.number = "", 0, False, 0

    def more(self) -> bool:
        """Appends the next chunk to the buffer (dropping what was decoded); False at the end of the file."""
        if self.eof:
            return False
        raw = self.file.read(CHUNK)
        self.eof = not raw
        self.buf = self.buf[self.pos:] + self.text.decode(raw, final=self.eof)
        self.pos = 0
        return bool(raw)

    def next_char(self) -> str:
        """The next character that is not blank ("" at the end of the file), not consumed."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos:self.pos + 1]

    def bad(self, record: int, kind: str, detail: str) -> tuple[str, Unreadable]:
        return f"{self.path}: record {record}", Unreadable(kind, detail)

    def cut(self, record: int, where: str) -> tuple[str, Unreadable]:
        return self.bad(record, "truncated", f"the file ends {where} (cut short?); the {self.number} complete "
                                             f"records before it are read")

    def records(self) -> Iterator[tuple[str, Any]]:
        try:
            if self.next_char() != "[":
                yield self.bad(1, "not_json", "not a JSON array (it does not open with [)")
                return
            self.pos += 1
            if self.next_char() == "]":
                return
            while True:
                if not self.next_char():
                    yield self.cut(self.number + 1, "where this record should start")
                    return
                value = yield from self.decode()
                if value is _STOP:
                    return
                self.number += 1
                yield f"{self.path}: record {self.number}", value
                after = self.next_char()
                if after == "]":
                    return
                if after != ",":
                    yield (self.cut(self.number, "after this record, without closing the array") if not after else
                           self.bad(self.number + 1, "not_json", f"not JSON (expected , or ] after record "
                                                                 f"{self.number}, found {self.buf[self.pos:][:20]!r}); "
                                                                 f"the array cannot be read past it"))
                    return
                self.pos += 1
        except UnicodeDecodeError as e:
            yield self.bad(self.number + 1, "not_utf8", f"not UTF-8 text ({e.reason}); the array cannot be read "
                                                        f"past it")

    def decode(self) -> Generator[tuple[str, Unreadable], None, Any]:
        """The value at the buffer's position (reading on while it runs past the buffer), or _STOP after
        yielding why there is none."""
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                # Decoding stopped at the end of what is buffered (or inside a string that runs past it): read
                # on; anything else is a syntax error, past which the array cannot be followed.
                incomplete = e.pos >= len(self.buf) - 16 or e.msg.startswith("Unterminated string")
                if incomplete and self.more():
                    continue
                yield (self.cut(self.number + 1, "inside this record") if incomplete else
                       self.bad(self.number + 1, "not_json", f"not JSON ({e.msg}); the array cannot be read past it"))
                return _STOP
            if end >= len(self.buf) and not isinstance(value, (dict, list)) and self.more():
                continue  # a number or literal at the buffer's end may go on in the next chunk
            self.pos = end
            return value


_STOP = object()


def _table_records(where: str, batches) -> Iterator[tuple[str, Any]]:
    number = 0
    for batch in batches:
        for row in batch.to_pylist():
            number += 1
            yield f"{where}: row {number}", row


def _parquet_records(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001  (pyarrow raises several types for a file it cannot read)
        raise DataError(f"{path} is not a readable Parquet file ({type(e).__name__}: {e})") from None
    yield from _table_records(str(path), file.iter_batches(batch_size=256))


def dataset_table(path: Path):
    """The Arrow table of the `datasets` dir at `path` (memory-mapped), or a DataError saying why there is none."""
    from datasets import DatasetDict, load_from_disk

    try:
        dataset = load_from_disk(str(path))
    except Exception as e:  # noqa: BLE001  (datasets raises several types for a dir it cannot read)
        raise DataError(f"{path} is not a dataset saved with datasets.save_to_disk ({type(e).__name__}: {e})") from None
    if isinstance(dataset, DatasetDict):  # one dir per split
        splits = sorted(dataset)
        raise DataError(f"{path} holds the splits {', '.join(splits)} (a DatasetDict); give one split's dir, e.g. "
                        f"{path / splits[0]}")
    return dataset.data.table


def _dataset_records(path: Path) -> Iterator[tuple[str, Any]]:
    yield from _table_records(str(path), dataset_table(path).to_batches(max_chunksize=256))


def source_sha256(path: Path) -> str:
    """The content hash of a rows file (its bytes), or of a `datasets` dir (its files' names and bytes)."""
    if not path.is_dir():
        return _sha256(path, hashlib.sha256()).hexdigest()
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + b"\0")
        _sha256(file, digest)
    return digest.hexdigest()


def _sha256(path: Path, digest):
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest
