"""`python -m eagle3.verifier from-gguf FILE OUT` on files that are no whole GGUF model: one message each, nothing
written. (The conversion of a real GGUF file: tests/test_reference.py, on SmolLM2's.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from commands import run_in_process


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    """A small GGUF file (a llama header and one fp32 tensor), written by the gguf package."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path_factory.mktemp("gguf") / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    writer.add_string("general.name", "tiny")
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def refused(tmp_path: Path, file: Path) -> str:
    proc = run_in_process(["python", "-m", "eagle3.verifier", "from-gguf", str(file), str(tmp_path / "out")])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and proc.stderr.count("error:") == 1
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))
    return proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("keep", [10, 120])
def test_a_gguf_file_cut_inside_its_header_is_one_message(gguf_file, keep, tmp_path):
    """An interrupted download: a struct.error traceback from transformers' reader."""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf_file.read_bytes()[:keep])
    assert refused(tmp_path, cut) == (f"error: {cut}: the file ends at byte {keep}, inside its header: it was cut "
                                      f"short (an interrupted download or copy?); fetch it again")


def test_a_gguf_file_cut_inside_its_tensor_data_is_one_message(gguf_file, tmp_path):
    data = gguf_file.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:len(data) - 100])
    assert refused(tmp_path, cut) == (f"error: {cut}: the file ends at byte {len(data) - 100}, inside its tensor data "
                                      f"(its header says they end at byte {len(data)}): it was cut short (an "
                                      f"interrupted download or copy?); fetch it again")


def test_a_directory_given_as_the_gguf_file_is_said_to_be_one(tmp_path):
    """It was said to be "no such file"."""
    (tmp_path / "models").mkdir()
    assert refused(tmp_path, tmp_path / "models") == f"error: {tmp_path / 'models'} is a directory, not a GGUF file"
