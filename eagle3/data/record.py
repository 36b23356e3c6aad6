"""What a prepared dataset holds, recorded next to it, and the trainer's comparison with the run's model config.

`<data_dir>/eagle3_data.json` says which verifier produced the hidden states (its fingerprint: a hash of its
config.json, eagle3.verifier.model), which aux layer ids they hold (Hugging Face `output_hidden_states` indexing)
and their hidden size. An off-by-one in the aux layer ids trains a draft that loads and runs fine and then accepts
fewer tokens in serving; this is where it is caught. Imports neither torch nor speculators: the launcher runs it
first.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from eagle3.config import DraftConfig
from eagle3.errors import DataError
from eagle3.verifier.model import Verifier

log = logging.getLogger(__name__)

RECORD = "eagle3_data.json"


def write_record(data_dir: Path, record: dict[str, Any]) -> None:
    from eagle3.safe_write import write_text

    write_text(data_dir, data_dir / RECORD, json.dumps(record, indent=2) + "\n")


def read_record(data_dir: Path) -> dict[str, Any] | None:
    file = Path(data_dir) / RECORD
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text())
    except ValueError as e:
        raise DataError(f"{file}: not JSON ({e}); it is written by eagle3 prepare") from None


def check_same_verifier(data_dir: Path, verifier_dir: Path) -> None:
    """Online rows from a dir that eagle3.data.prepare wrote: its record's verifier must be this run's, or the rows'
    token ids come from another tokenizer. Without a record (a JSONL's cached rows, speculators' pipeline), nothing
    to compare."""
    record = read_record(data_dir)
    if record is None or "verifier" not in record:
        return
    ours, theirs = Verifier(verifier_dir).fingerprint(), record["verifier"]
    if theirs.get("config_hash") != ours["config_hash"]:
        raise DataError(f"the rows in {data_dir} were prepared for another verifier: {theirs.get('path')} (config "
                        f"hash {theirs.get('config_hash')}), this run's verifier is {verifier_dir} (config hash "
                        f"{ours['config_hash']}); their token ids belong to its tokenizer")


def check_record(data_dir: Path, verifier_dir: Path, draft: DraftConfig) -> dict[str, Any] | None:
    """Refuses data whose hidden states came from another verifier, other aux layers or another hidden size
    than the run's; warns when the data carries no record (speculators' own pipeline writes none)."""
    record = read_record(data_dir)
    if record is None:
        log.warning("%s has no %s (not written by eagle3 prepare): cannot check that its hidden "
                    "states come from %s at aux layers %s", data_dir, RECORD, verifier_dir, draft.aux_layer_ids)
        return None
    if not record.get("complete", False):
        raise DataError(f"{data_dir}: its preparation did not finish ({RECORD} says complete: false); run the "
                          f"same eagle3 prepare command again, it resumes")
    ours = Verifier(verifier_dir).fingerprint()
    theirs = record["verifier"]
    if theirs["config_hash"] != ours["config_hash"]:
        raise DataError(f"the data's hidden states come from another verifier: {data_dir} was prepared from "
                          f"{theirs['path']} (config hash {theirs['config_hash']}), this run's verifier is "
                          f"{verifier_dir} (config hash {ours['config_hash']})")
    if list(record["aux_layer_ids"]) != list(draft.aux_layer_ids):
        raise DataError(f"model.draft.aux_layer_ids={list(draft.aux_layer_ids)} but {data_dir} holds the "
                          f"hidden states of layers {record['aux_layer_ids']} (Hugging Face output_hidden_states "
                          f"indexing); set model.draft.aux_layer_ids={record['aux_layer_ids']} or prepare the data "
                          f"again")
    if record["hidden_size"] != draft.hidden_size:
        raise DataError(f"model.draft.hidden_size={draft.hidden_size} but {data_dir} holds hidden states of "
                          f"size {record['hidden_size']}")
    return record
