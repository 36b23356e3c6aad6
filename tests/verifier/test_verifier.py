"""Verifiers that gave wrong hidden states or ran code: sliding-window attention under data=online's packed
forward (online must equal prepare's offline files), model dirs that define their own code (never run, one
message), and safetensors headers whose offsets do not describe the file (one message, before anything loads)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from eagle3.errors import ConfigError
from factories import chat_tokenizer, chat_words, verifier_dir, verifier_model

# The sampler warns about the rows longer than a micro-batch on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:Found .* samples longer than batch_max_length")

VOCAB, HIDDEN, LAYERS, WINDOW = 256, 64, 4, 16
AUX = [1, 2, 3]
T = 64  # tokens per micro-batch: rows and their packs are longer than the window


# --- sliding-window verifiers: data=online's packed forward gives prepare's hidden states ---------------------

def small(**kw) -> dict:
    return dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=LAYERS,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, **kw)


def save_verifier(kind: str, path: Path) -> Path:
    """`kind`: "mixed", a Qwen2 whose first 2 layers attend fully and the others within a 16-token window;
    "sliding", a Mistral whose every layer has the window."""
    if kind == "mixed":
        model = verifier_model(0, "qwen2", **small(use_sliding_window=True, sliding_window=WINDOW,
                                                   max_window_layers=2))
        assert model.config.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2
    else:
        model = verifier_model(0, "mistral", **small(sliding_window=WINDOW))
    model.save_pretrained(str(path))
    return path


def windowed_rows() -> list[tuple[list[int], list[int]]]:
    """Rows of 1 to 130 tokens, most longer than the window, several to a micro-batch."""
    rng = random.Random(1)
    lengths = [1, 2, 90, 130] + [rng.randint(3, 60) for _ in range(28)]
    out = []
    for n in lengths:
        ids = [rng.randrange(VOCAB) for _ in range(n)]
        out.append((ids, [0] * min(4, n - 1) + [1] * (n - min(4, n - 1))))
    return out


@pytest.fixture(scope="module", params=["mixed", "sliding"])
def windowed(request, tmp_path_factory) -> dict:
    """A sliding-window verifier, the rows prepared offline in fp32, and the same rows as token rows alone."""
    from eagle3.data.prepare import write_dataset
    from eagle3.data.token_rows import save_rows
    from eagle3.verifier.model import Verifier

    tmp = tmp_path_factory.mktemp(f"window-{request.param}")
    verifier = save_verifier(request.param, tmp / "verifier")
    rows = windowed_rows()
    model = Verifier(verifier).load()
    write_dataset(model, verifier, rows, tmp / "offline", AUX, batch_tokens=512, dtype=torch.float32)
    save_rows(rows, tmp / "rows")
    return {"verifier": verifier, "model": model, "rows": rows, "offline": tmp / "offline", "token_rows": tmp / "rows"}


def test_prepare_keeps_the_window_of_each_layer(windowed):
    """The offline files (padded batches, transformers' own masks) hold each row's own forward's values, and those
    differ past the window from what the same weights give attending to the whole row: the window matters here."""
    from safetensors.torch import load_file

    model, rows = windowed["model"], windowed["rows"]
    row = max(range(len(rows)), key=lambda i: len(rows[i][0]))
    ids = torch.tensor([rows[row][0]])
    assert ids.shape[1] > 4 * WINDOW
    stored = load_file(str(windowed["offline"] / "hidden_states" / f"hs_{row}.safetensors"))["hidden_states"]
    with torch.no_grad():
        own = model(input_ids=ids, output_hidden_states=True).hidden_states
        torch.testing.assert_close(stored[:, :len(AUX)], torch.stack([own[i][0] for i in AUX], dim=1),
                                   rtol=0, atol=1e-5)
    full = type(model)(type(model.config)(**{**model.config.to_dict(), "sliding_window": None,
                                             "use_sliding_window": False, "layer_types": None}))
    full.load_state_dict(model.state_dict())
    with torch.no_grad():
        unwindowed = full.eval()(input_ids=ids, output_hidden_states=True).hidden_states[AUX[-1]][0]
    torch.testing.assert_close(unwindowed[:WINDOW], stored[:WINDOW, len(AUX) - 1], rtol=0, atol=1e-5)
    assert (unwindowed[2 * WINDOW:] - stored[2 * WINDOW:, len(AUX) - 1]).abs().max() > 1e-3


def test_online_micro_batches_are_the_offline_ones_for_sliding_window_verifiers(windowed):
    from eagle3.data.loader import LoaderSpec, build_loaders
    from eagle3.data.online import OnlineVerifier

    def loaders(data_dir: Path, verifier=None, **online):
        return build_loaders(data_dir, LoaderSpec(T, HIDDEN, len(AUX), 0.8, seed=3, **online), verifier)

    verifier = OnlineVerifier(windowed["model"], AUX)
    offline = loaders(windowed["offline"])
    online = loaders(windowed["token_rows"], verifier=verifier, hidden_states_dtype=torch.float32)
    packs_past_window = 0
    for off, on in [(offline[0], online[0]), (offline[1], online[1])]:
        assert len(on) == len(off) > 0
        for count, (a, b) in enumerate(zip(off, on, strict=True)):
            for key in ("input_ids", "loss_mask", "position_ids", "document_ids"):
                assert torch.equal(a[key], b[key]), f"micro-batch {count}: {key}"
            torch.testing.assert_close(b["hidden_buffer"], a["hidden_buffer"], rtol=0, atol=1e-5,
                                       msg=lambda m, count=count: f"micro-batch {count}: {m}")
            docs = a["document_ids"][0]
            packs_past_window += int(docs.max() > 0 and a["position_ids"][0].max() > WINDOW)
    assert packs_past_window  # several documents in one pack, one of them longer than the window


def test_online_refuses_a_verifier_whose_attention_packing_cannot_confine(tmp_path):
    """Chunked attention counts its chunks from the packed row's start: one message before any rank starts."""
    from transformers import Qwen2Config

    from eagle3.config import DraftConfig
    from eagle3.data.online import check_online_verifier

    Qwen2Config(**small(layer_types=["full_attention", "chunked_attention"] * 2)).save_pretrained(str(tmp_path))
    draft = DraftConfig(hidden_size=HIDDEN, vocab_size=VOCAB, aux_layer_ids=AUX)
    with pytest.raises(ConfigError, match="chunked_attention.*data=offline"):
        check_online_verifier(tmp_path, draft)


# --- model dirs with code of their own: never run, whatever stdin answers ---------------------------------------

def marker_code(marker: Path) -> str:
    """A module that leaves `marker` behind when imported: what a dir's model code would run."""
    return f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"


def with_own_code(path: Path, marker: Path, json_file: str, auto_map: dict, **fields) -> Path:
    """`path`'s `json_file` given an auto_map (and `fields`) naming modules in the dir that write `marker`."""
    import json

    file = path / json_file
    config = json.loads(file.read_text()) if file.is_file() else {}
    file.write_text(json.dumps({**config, **fields, "auto_map": auto_map}))
    for name in {(v if isinstance(v, str) else next(x for x in v if x)).split(".")[0] for v in auto_map.values()}:
        (path / f"{name}.py").write_text(marker_code(marker))
    return path


def small_verifier(path: Path) -> Path:
    """A small Llama verifier with a word-level tokenizer that has a chat template."""
    return verifier_dir(path, tokenizer=chat_tokenizer(chat_words(100)), **small())


def launch_answering_yes(args: list[str], cache_dir: Path):
    """launch.py ARGS (in this process) with stdin answering "y" to any prompt (transformers asks before it runs a
    dir's code: input(), which reads sys.stdin)."""
    import io
    from unittest import mock

    from commands import launch

    with mock.patch("sys.stdin", io.StringIO("y\n" * 20)):
        return launch(args, cache_dir)


def chat_rows(path: Path) -> Path:
    import json

    rows = [{"messages": [{"role": "user", "content": " ".join(f"w{(i + j) % 100}" for j in range(8))},
                          {"role": "assistant", "content": " ".join(f"w{(3 * i + j) % 100}" for j in range(12))}]}
            for i in range(40)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


CODE_CASES = {
    # the verifier's config.json: a model type transformers does not know, defined by the dir's own modules
    "verifier": ("config.json", {"AutoConfig": "configuration_own.OwnConfig",
                                 "AutoModelForCausalLM": "modeling_own.OwnForCausalLM"}, {"model_type": "own_model"}),
    # its tokenizer: a tokenizer class of the dir's own
    "tokenizer": ("tokenizer_config.json", {"AutoTokenizer": ["tokenization_own.OwnTokenizer", None]},
                  {"tokenizer_class": "OwnTokenizer"}),
    # a pretrained drafter (init=pretrained) whose config.json names code of its own
    "drafter": ("config.json", {"AutoConfig": "configuration_own.OwnConfig",
                                "AutoModel": "modeling_own.OwnDrafter"}, {"model_type": "own_drafter"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CODE_CASES))
def test_no_load_runs_code_from_a_model_dir_even_when_stdin_says_yes(case, tmp_path):
    verifier = small_verifier(tmp_path / "verifier")
    marker = tmp_path / "code-ran"
    json_file, auto_map, fields = CODE_CASES[case]
    owner = verifier if case != "drafter" else tmp_path / "drafter"
    owner.mkdir(exist_ok=True)
    with_own_code(owner, marker, json_file, auto_map, **fields)
    rows = chat_rows(tmp_path / "rows.jsonl")
    args = ["model=auto", f"model.verifier.path={verifier}", "data=online", f"data.path={rows}",
            f"hydra.run.dir={tmp_path / 'run'}", "logger.mode=disabled", "data.total_seq_len=256", "optim.max_steps=1",
            "model.draft.aux_layer_ids=[1,2,3]"]
    if case == "drafter":
        args += ["init=pretrained", f"init.path={owner}"]
    proc = launch_answering_yes(args, tmp_path / "cache")
    assert not marker.exists(), f"the {case} dir's code ran:\n{proc.stdout}\n{proc.stderr}"
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert str(owner) in proc.stderr, proc.stderr
    if case != "drafter":
        assert "never run" in proc.stderr, proc.stderr


# --- safetensors headers: offsets that do not describe the data are refused as safetensors refuses them -----------

def rewrite_header(file: Path, edit, tail: bytes = b"") -> None:
    """`file`'s JSON header replaced by `edit(header)`, its data kept (then `tail` appended)."""
    import json

    data = file.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = edit(json.loads(data[8:8 + n]))
    new = json.dumps(header).encode()
    file.write_bytes(len(new).to_bytes(8, "little") + new + data[8 + n:] + tail)


def offsets(**changes):
    """An edit setting tensors' data_offsets (and shapes): {"a": [start, end]} or {"a": ([start, end], shape)}."""
    def edit(header):
        for name, change in changes.items():
            span, shape = change if isinstance(change, tuple) else (change, header[name]["shape"])
            header[name] = {**header[name], "data_offsets": span, "shape": shape}
        return header
    return edit


# Two tensors as safetensors writes them: a F32 [3] at [0, 12], b BF16 [2] at [12, 16].
BAD_OFFSETS = {
    "negative": (offsets(a=[-12, 0]), "'a': its data offsets [-12, 0] are not non-negative integers"),
    "reversed": (offsets(a=[12, 0]), "'a': its data offsets [12, 0] end before they start"),
    "overlapping": (offsets(b=[8, 12]), "'b': its data offsets [8, 12] overlap the tensor before it"),
    "gap": (offsets(b=([14, 16], [1])), "'b': its data offsets [14, 16] leave a gap"),
    "not sized by dtype x shape": (offsets(a=([0, 12], [4])), "'a': its data offsets give 12 bytes, its F32 shape [4] "
                                                             "needs 16"),
    "bytes after the data": (offsets(), "4 bytes after the data its header describes"),
    "not ending at the data's end": (offsets(b=([12, 14], [1])), "2 bytes after the data"),
}


def two_tensors(path: Path) -> Path:
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(3), "b": torch.ones(2, dtype=torch.bfloat16)}, str(path))
    return path


def specs_of(file: Path):
    import os

    from eagle3.formats.tensorfile import read_specs

    fd = os.open(file, os.O_RDONLY)
    try:
        return read_specs(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("case", list(BAD_OFFSETS))
def test_a_header_whose_offsets_safetensors_refuses_is_refused(case, tmp_path):
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from eagle3.formats.tensorfile import HeaderError

    edit, says = BAD_OFFSETS[case]
    file = two_tensors(tmp_path / "t.safetensors")
    rewrite_header(file, edit, tail=bytes(4) if case == "bytes after the data" else b"")
    with pytest.raises((SafetensorError, ValueError)):  # what loading it would give: not a loadable file
        load_file(str(file))
    with pytest.raises(HeaderError) as error:
        specs_of(file)
    assert says in str(error.value), str(error.value)


def test_headers_safetensors_loads_still_pass(tmp_path):
    """Offsets listed out of order, empty tensors, sub-byte and 8-bit dtypes: all loadable, all accepted."""
    from safetensors.torch import load_file, save_file

    file = two_tensors(tmp_path / "swapped.safetensors")
    rewrite_header(file, lambda h: {"b": h["b"], "a": h["a"], "__metadata__": {"format": "pt"}})
    assert sorted(load_file(str(file))) == sorted(specs_of(file)) == ["a", "b"]
    tensors = {"empty": torch.zeros(0, 5), "byte": torch.zeros(3, dtype=torch.uint8),
               "f8": torch.zeros(5, dtype=torch.float8_e4m3fn), "long": torch.arange(4), "half": torch.ones(7).half()}
    save_file(tensors, str(tmp_path / "mixed.safetensors"))
    specs = specs_of(tmp_path / "mixed.safetensors")
    assert {k: s.shape for k, s in specs.items()} == {k: tuple(v.shape) for k, v in tensors.items()}


@pytest.fixture(scope="module")
def draft_checkpoint(tmp_path_factory) -> Path:
    """A real speculators checkpoint of a small draft (speculators' own save_pretrained), untrained."""
    from eagle3.config import SPECULATORS_FLAGS, DraftConfig
    from eagle3.init.build import bare_draft

    draft = DraftConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rope_theta=10000.0,
                        rms_norm_eps=1e-6, hidden_act="silu", draft_vocab_size=48, aux_layer_ids=[1, 2, 3],
                        ttt_steps=3)
    path = tmp_path_factory.mktemp("ckpt") / "best"
    bare_draft(draft, SPECULATORS_FLAGS, "cpu").save_pretrained(str(path))
    return path


@pytest.mark.parametrize("case", ["negative", "reversed", "overlapping"])
def test_export_and_init_pretrained_refuse_a_checkpoint_with_bad_offsets(case, draft_checkpoint, tmp_path, capsys):
    """One message naming the file, nothing exported; init=pretrained's reading of the checkpoint says the same."""
    import shutil

    from eagle3.cli.export import main
    from eagle3.errors import CheckpointError
    from eagle3.init.pretrained import read_source

    broken = tmp_path / "broken"
    shutil.copytree(draft_checkpoint, broken)
    specs = specs_of(broken / "model.safetensors")
    first, second = sorted(specs, key=lambda k: specs[k].start)[:2]
    edits = {"negative": lambda h: offsets(**{first: [-8, h[first]["data_offsets"][1]]})(h),
             "reversed": lambda h: offsets(**{first: h[first]["data_offsets"][::-1]})(h),
             "overlapping": lambda h: offsets(**{second: [o - 4 for o in h[second]["data_offsets"]]})(h)}
    rewrite_header(broken / "model.safetensors", edits[case])
    from commands import exit_status_of

    out = tmp_path / "out"
    assert exit_status_of(main, [str(broken), "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{broken / 'model.safetensors'}: not a safetensors file" in err, err
    assert err.count("\n") == 1 and not out.exists()
    with pytest.raises(CheckpointError, match="not a safetensors file .*data offsets"):
        read_source(broken, {})
