"""The verifier as every module asks it (eagle3/verifier/model.py): one Verifier(path) reads its config.json once,
one function reads a model dir's safetensors index, and no other module opens either file."""

from __future__ import annotations

import ast
import builtins
import io
import json
import re
from pathlib import Path

import pytest

import eagle3
from eagle3.errors import CheckpointError, ConfigError

PACKAGE = Path(eagle3.__file__).parent

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 8,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 300,
         "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "eos_token_id": 2, "tie_word_embeddings": True}


def counted_opens(monkeypatch, file: Path) -> list[str]:
    """The opens of `file` for reading from now on (open() and Path.read_text alike go through io.open)."""
    opens: list[str] = []
    real = io.open

    def counting(target, *args, **kwargs):
        mode = args[0] if args else kwargs.get("mode", "r")
        if Path(str(target)) == file and not set(mode) & set("wax+"):
            opens.append(str(target))
        return real(target, *args, **kwargs)

    monkeypatch.setattr(io, "open", counting)
    monkeypatch.setattr(builtins, "open", counting)
    return opens


def test_a_verifiers_config_json_is_read_once_whatever_is_asked(tmp_path, monkeypatch):
    from eagle3.config import DraftConfig, ModelConfig, VerifierConfig
    from eagle3.data.online import check_online_verifier
    from eagle3.data.record import check_same_verifier
    from eagle3.verifier.model import Verifier
    from eagle3.verifier.shape import check_verifier_dir, verifier_config

    verifier = tmp_path / "verifier"
    verifier.mkdir()
    (verifier / "config.json").write_text(json.dumps(LLAMA))
    opens = counted_opens(monkeypatch, verifier / "config.json")
    asked = Verifier(verifier)
    assert asked.config["hidden_size"] == 64 and asked.size("vocab_size") == 300 and asked.positions == 256
    assert asked.eos_ids() == [2] and not asked.quantized and asked.fingerprint()["num_hidden_layers"] == 8
    # Other modules' questions, each through a Verifier of its own: the file is not opened again while unchanged.
    assert [verifier_config(verifier, key) for key in ("hidden_size", "head_dim", "aux_layer_ids")] == [64, 16,
                                                                                                         [2, 4, 5]]
    def model(aux_layer_ids: list[int]) -> ModelConfig:
        return ModelConfig(name="auto", verifier=VerifierConfig(path=str(verifier)),
                           draft=DraftConfig(aux_layer_ids=aux_layer_ids))

    check_verifier_dir(model([2, 4, 5]))  # the run config's check of the dir: its 8 layers hold these
    with pytest.raises(ConfigError, match=r"\[2, 4, 8\] goes beyond the verifier's 8 decoder layers"):
        check_verifier_dir(model([2, 4, 8]))
    check_same_verifier(tmp_path, verifier)
    with pytest.raises(ConfigError, match="model.draft.hidden_size=32 but"):
        check_online_verifier(verifier, DraftConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                                    num_key_value_heads=2, vocab_size=300, draft_vocab_size=300))
    assert len(opens) == 1, opens
    # A rewritten config.json is read again, not served from before.
    (verifier / "config.json").write_text(json.dumps({**LLAMA, "max_position_embeddings": 1024}))
    assert Verifier(verifier).positions == 1024 and len(opens) == 2


def test_a_missing_or_broken_config_json_is_one_message_naming_the_option(tmp_path):
    from eagle3.verifier.model import Verifier

    with pytest.raises(ConfigError, match=f"^--model: {re.escape(str(tmp_path))} has no config.json; expected a "
                                          f"local Hugging Face"):
        Verifier(tmp_path, key="--model").fingerprint()
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="^--verifier: .*config.json: not a Hugging Face config"):
        _ = Verifier(tmp_path, key="--verifier").raw
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="^model.verifier.path: .*config.json: cannot read the verifier's config"):
        _ = Verifier(tmp_path).config


def sharded(directory: Path, weight_map) -> Path:
    import torch
    from safetensors.torch import save_file

    directory.mkdir()
    save_file({"a": torch.zeros(2)}, str(directory / "model-00001-of-00001.safetensors"))
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return directory


def test_the_safetensors_index_is_read_by_one_function_with_one_error(tmp_path):
    from eagle3.formats.tensorfile import WeightFilesError, weight_files
    from eagle3.init.files import checkpoint_files
    from eagle3.verifier.model import Verifier

    good = sharded(tmp_path / "good", {"a": "model-00001-of-00001.safetensors"})
    assert weight_files(good) == [good / "model-00001-of-00001.safetensors"]
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(b"")
    cases = {  # the index's problem -> what the message says
        "[]": "not a safetensors index",
        "{}": "not a safetensors index (KeyError",
        json.dumps({"weight_map": {"a": "gone.safetensors"}}): "names shards that are not there: gone.safetensors",
        json.dumps({"weight_map": {"a": "../outside.safetensors"}}): "not a file name in the dir",
        json.dumps({"weight_map": {}}): "its weight_map names no file",
    }
    for text, says in cases.items():
        (good / "model.safetensors.index.json").write_text(text)
        with pytest.raises(WeightFilesError, match=f"^{re.escape(str(good))}/model.safetensors.index.json.*"
                                                   f"{re.escape(says)}"):
            weight_files(good)
        # Its callers add their option, each in its own error kind.
        with pytest.raises(CheckpointError, match=re.escape(says)):
            checkpoint_files(good, "init.path")
        with pytest.raises(ConfigError, match=f"^model.verifier.path: .*{re.escape(says)}"):
            Verifier(good).weight_files()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "pytorch_model.bin").write_bytes(b"not even a pickle")
    with pytest.raises(WeightFilesError, match="no safetensors weights .*pickle files are never loaded"):
        weight_files(empty)


# Modules that name config.json in code (not in a message), and why. A verifier's is read in eagle3/verifier/model.py
# alone; a draft checkpoint's in eagle3/init/files.py (read_config) alone.
CONFIG_JSON = {
    "verifier/model.py": "the verifier's config.json: its one reader",
    "init/files.py": "a draft checkpoint's config.json: its one reader (read_config)",
    "config/model.py": "model.verifier.path must hold a config.json (its existence, not read)",
    "config/training.py": "init.path must hold a checkpoint's config.json (its existence, not read)",
    "eval/accept.py": "the checkpoint argument must hold a config.json (its existence, not read)",
    "serve/export.py": "writes the exported checkpoint's config.json",
    "provenance.py": "hashes a checkpoint's files, config.json among them (bytes, not parsed)",
}
# Each name in code (not in a message) in these modules only.
ONLY_IN = {
    "model.safetensors.index.json": {"formats/tensorfile.py"},  # weight_files: the one reader of the index
    "AutoConfig": {"verifier/model.py"},
    "AutoModelForCausalLM": {"verifier/model.py", "verifier/gguf.py"},  # gguf: from-gguf converts a GGUF file
    "AutoTokenizer": {"verifier/model.py", "verifier/gguf.py"},
}


def names_in_code(tree: ast.AST) -> set[str]:
    """String constants and identifiers in `tree`, less the text of f-strings (messages)."""
    in_messages = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for sub in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_messages:
            found.add(node.value)
        elif isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.alias):
            found.add(node.name)
    return found


def test_only_the_verifier_module_opens_a_verifiers_config_json_and_loads_it():
    where: dict[str, set[str]] = {name: set() for name in ["config.json", *ONLY_IN]}
    for file in sorted(PACKAGE.rglob("*.py")):
        found = names_in_code(ast.parse(file.read_text()))
        for name in where:
            if name in found:
                where[name].add(file.relative_to(PACKAGE).as_posix())
    outside = where.pop("config.json") - set(CONFIG_JSON)
    assert not outside, f"config.json named in code outside the modules that may: {sorted(outside)}"
    for name, allowed in ONLY_IN.items():
        assert where[name] <= allowed, f"{name} outside {sorted(allowed)}: {sorted(where[name] - allowed)}"


def test_from_gguf_stopped_by_ctrl_c_exits_130_with_one_line(monkeypatch, capsys, tmp_path):
    """It exited 1 (its message as SystemExit's), where every other command stopped by Ctrl-C exits 130."""
    import eagle3.verifier.gguf as gguf
    from eagle3.cli.verifier import main

    def converting(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf, "from_gguf", converting)
    with pytest.raises(SystemExit) as stopped:
        main(["from-gguf", str(tmp_path / "model.gguf"), str(tmp_path / "out")])
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "interrupted (Ctrl-C): nothing was written\n"
