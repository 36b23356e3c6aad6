"""The files data rows come in, one reader per file format; what a row holds is eagle3/formats/row_formats.py's concern.

    a JSONL file            one JSON value per line                          "<file>:<line>"
    a JSON array file       `[{...}, {...}, ...]` (ShareGPT's), streamed     "<file>: record <n>"
    a Parquet file          by its `.parquet` suffix, in record batches      "<file>: row <n>"
    a `datasets` dir        saved with `datasets.save_to_disk`               "<dir>: row <n>"

`records(path)` yields each record in file order as (where, value): `where` names it in messages, `value` is the
parsed value, or an `Unreadable` saying why it could not be read (text that is not UTF-8, not JSON, a file cut
inside a record), which the caller's bad-row policy handles. A JSON array is read one record at a time, never
whole: ShareGPT V3 is a 125 MB array, and the copy in its PyPI wheel is cut mid-record; its complete records are
read, and the cut is one unreadable record after them. A syntax error (or bytes that are not UTF-8) inside an
array is no bad record but a DataError whatever the bad-row policy: no record after it can be found, so skipping
it would drop the rest of the file; the error says where it is and how much of the file follows. A UTF-8 byte
order mark (Windows tools write one) at the start of a JSONL file or JSON array is read past.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.errors import DataError

CHUNK = 1 << 20  # characters of a JSON array read at a time
BOM = codecs.BOM_UTF8  # a UTF-8 byte order mark, which some Windows tools write at the start of a text file


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
        head = f.read(4096).removeprefix(BOM).lstrip()
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
            if number == 1:
                raw = raw.removeprefix(BOM)
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
        if f.read(len(BOM)) != BOM:
            f.seek(0)
        yield from _ArrayStream(path, f).records()


class _ArrayStream:
    """The elements of a JSON array, decoded one at a time from a buffer refilled `CHUNK` characters at a time."""

    def __init__(self, path: Path, file):
        self.path, self.file = path, file
        self.text = codecs.getincrementaldecoder("utf-8")()
        self.decoder = json.JSONDecoder()
        self.buf, self.pos, self.eof, self.number = "", 0, False, 0
        self.lines = 0     # the lines of the text dropped from the buffer
        self.read_to = 0   # the offset in the file of the buffer's end
        self.broken: tuple[str, int] | None = None  # bytes that are not UTF-8 where the buffer ends: why, where

    def more(self) -> bool:
        """Appends the next chunk to the buffer (dropping what was decoded); False at the end of the file."""
        if self.broken:  # the text before them is all read
            raise self.unreadable(*self.broken)
        if self.eof:
            return False
        pending = self.text.getstate()[0]  # the bytes of a character cut at the end of the last chunk
        raw = self.file.read(CHUNK)
        self.eof = not raw
        try:
            text = self.text.decode(raw, final=self.eof)
            self.read_to = self.file.tell() - len(self.text.getstate()[0])
        except UnicodeDecodeError as e:  # e.start counts from the pending bytes
            text = (pending + raw)[:e.start].decode("utf-8")
            self.read_to = self.file.tell() - len(raw) - len(pending) + e.start
            self.broken = f"not UTF-8 text ({e.reason})", self.read_to
        self.lines += self.buf.count("\n", 0, self.pos)
        self.buf = self.buf[self.pos:] + text
        self.pos = 0
        return bool(raw)

    def not_json(self, detail: str, pos: int) -> DataError:
        """unreadable() for a syntax error at the buffer's character `pos`, with its byte offset and line."""
        offset = self.read_to - len(self.buf[pos:].encode("utf-8"))
        line = self.lines + self.buf.count("\n", 0, pos) + 1
        return self.unreadable(f"not JSON ({detail}) at line {line}", offset)

    def unreadable(self, what: str, offset: int) -> DataError:
        """Record number + 1 cannot be read, at byte `offset`, and no record past it can be found."""
        size = os.fstat(self.file.fileno()).st_size
        return DataError(f"{self.path}: record {self.number + 1}: {what}, byte {offset:,} of {size:,}. A JSON array "
                         f"cannot be read past an error in it, so the {size - offset:,} bytes after it "
                         f"({(size - offset) / max(size, 1):.0%} of the file) would go unread: refused, whatever the "
                         f"bad-row policy (it leaves out records, not the rest of a file). Fix the file there; the "
                         f"records before it ({self.number}) are whole")

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
            if not after:
                yield self.cut(self.number, "after this record, without closing the array")
                return
            if after != ",":
                raise self.not_json(f"expected , or ] after record {self.number}, found {self.buf[self.pos:][:20]!r}",
                                    self.pos)
            self.pos += 1

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
                if not incomplete:
                    raise self.not_json(e.msg, e.pos) from None
                yield self.cut(self.number + 1, "inside this record")
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
