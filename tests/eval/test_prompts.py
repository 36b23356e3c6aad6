"""Prompt files (eagle3.eval.prompts), as eval.accept --prompts and the val passes read them: a bad line is one
message naming the file and line (or the val row), a file that is not UTF-8 text is refused before a run starts."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from eagle3.errors import ConfigError, DataError
from factories import verifier_model


def test_accept_prompt_errors_name_the_file_line(tmp_path):
    from eagle3.config import ConfigError
    from eagle3.eval.measure import AcceptanceProbe
    from eagle3.eval.prompts import read_prompts_file

    verifier = verifier_model(None, vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text('{"input_ids": [1, 2, 3]}\n\n{"input_ids": [4, 99]}\n')  # line 3 is out of vocab
    with pytest.raises(ConfigError, match=r"prompts\.jsonl:3: token ids outside the verifier's vocabulary"):
        AcceptanceProbe(verifier, read_prompts_file(prompts_file, tmp_path), k=2, max_new_tokens=4)
    with pytest.raises(ConfigError, match=r"prompt 2 \(1-based\): the prompt is empty"):
        AcceptanceProbe(verifier, [[1, 2], []], k=2, max_new_tokens=4)

    from datasets import Dataset

    from eagle3.eval.prompts import val_split_prompts

    ids = [[1, 2, 3, 4]] * 10
    ids[7] = [1, 99, 3, 4]  # the val split is rows 5..9; row 7's prompt is out of vocabulary
    Dataset.from_dict({"input_ids": ids, "loss_mask": [[0, 0, 1, 1]] * 10, "seq_len": [4] * 10}).save_to_disk(
        str(tmp_path / "ds"))
    with pytest.raises(ConfigError, match=r"val row 7 of .*ds: token ids outside"):
        AcceptanceProbe(verifier, val_split_prompts(tmp_path / "ds", 0.5, 8), k=2, max_new_tokens=4)


def test_a_prompts_file_that_is_not_utf8_is_one_error(tmp_path):
    from eagle3.config import validate
    from eagle3.eval.prompts import read_prompts_file
    from factories import compose_cfg

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b'{"input_ids": [1, 2, 3]}\n{"input_ids": [4, 5]}  \xff\xfe\n')
    with pytest.raises(DataError, match=r"prompts.jsonl:2: not UTF-8 text"):
        read_prompts_file(prompts, tmp_path)  # as eval.accept --prompts and the val passes read it
    prompts.write_bytes(b"\xff\xfe" + "{}".encode("utf-16-le"))  # a UTF-16 file: refused before the run starts
    plain = OmegaConf.to_container(compose_cfg(["eval.accept.enabled=true", f"eval.accept.prompts={prompts}"]),
                                   resolve=True, enum_to_str=True)
    with pytest.raises(ConfigError, match="^eval.accept.prompts: .*not UTF-8"):
        validate(plain)
