"""What tests build by hand, built in one place: the composed and typed configs of conf/ (compose_cfg and the
run configs), small verifiers (a model in memory, a saved Hugging Face dir, or only its config.json), word-level
chat tokenizers, run dirs as eagle3 reads them, a disk that fills up, and the comparisons of a built draft
with eagle3.plan.memory's counts and speculators' forward. Fixtures are tests/conftest.py's; commands run in process
or in a process of their own are tests/commands.py's."""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
from collections import namedtuple
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra.core.global_hydra import GlobalHydra
from omegaconf import open_dict

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

# A smaller dataset than the default run's, so that the suite stays within minutes on 2 cores.
SMALL_DATA = ["data.synth.num_samples=128", "data.synth.response_len=48", "data.total_seq_len=512"]
# The non-parallel drafts' three axes in one draft (decoder layer, depth, EAGLE-3.1's norms) with gradient
# checkpointing, trained once (tests/conftest.py's `qwen3_eagle31_run`): test_draft_arch resumes it, test_serve_arch
# serves it.
QWEN3_EAGLE31 = ["model.draft.layer_type=qwen3", "model.draft.num_layers=2", "model.draft.eagle31=true",
                 "model.draft.gradient_checkpointing=true"]
QWEN3_EAGLE31_RUN = ["optim.max_steps=8", "logger.log_every=1", "logger.mode=disabled", *SMALL_DATA, *QWEN3_EAGLE31]


# A slice of the real data a real-model test can afford (tests/conftest.py's `chat_rows`): a few ShareGPT
# conversations, their turns cut short, so that each row is a few hundred tokens; and the overrides that train a
# SmolLM2 draft on it in a few steps: a small draft vocabulary, short packed batches.
CONVERSATIONS, TURN_CHARS = 6, 400
SMOLLM2_TRAIN = ["model=auto", "model.draft.draft_vocab_size=1024", "data.total_seq_len=512", "data.train_ratio=0.67",
                 "optim.max_steps=3", "optim.lr=1e-3", "logger.mode=disabled", "logger.log_every=1",
                 "data.hidden_states_dtype=float32"]


def first_exchange(record: dict) -> dict | None:
    """A ShareGPT record cut to its first human turn and the answer to it, each turn cut short, in ShareGPT's own
    format; None when it has no such exchange (an empty conversation, a last unanswered turn)."""
    turns = record["conversations"]
    first = next((i for i, t in enumerate(turns) if t["from"] == "human"), len(turns))
    exchange = [{**t, "value": t["value"][:TURN_CHARS]} for t in turns[first:first + 2]]
    if [t["from"] for t in exchange] != ["human", "gpt"] or not all(t["value"].strip() for t in exchange):
        return None
    return {"id": record["id"], "conversations": exchange}


def sharegpt_slice(sharegpt_file: Path, path: Path) -> Path:
    """The head of the ShareGPT file as ShareGPT's own JSON array of `conversations` records at `path`, read by the
    project's reader like data.path: CONVERSATIONS conversations, each its first exchange, cut short."""
    from itertools import islice

    from eagle3.formats.row_files import records

    head = [record for _, record in islice(records(sharegpt_file), 4 * CONVERSATIONS)]
    kept = [r for r in map(first_exchange, head) if r]
    assert len(kept) >= CONVERSATIONS, "the head of the ShareGPT file has human/gpt exchanges"
    path.write_text(json.dumps(kept[:CONVERSATIONS], indent=2))
    return path


# --- configs: conf/ composed as Hydra composes it, typed as the launcher types it ---------------------------------

@functools.cache
def registered_configs() -> None:
    """eagle3's schemas in Hydra's ConfigStore, stored once per process (the store outlives GlobalHydra.clear())."""
    from eagle3.config import register_configs
    from eagle3.verifier.shape import register_resolvers

    register_configs()
    register_resolvers()


def compose_cfg(overrides: list[str] | None = None, return_hydra_config: bool = False):
    """conf/train.yaml composed with `overrides`, as Hydra's compose API composes it, so that the many tests that
    compose the default or a variant of it pay Hydra's composition (a fifth of a CPU-second) once per process:
    the overrides of keys (`model.draft.num_layers=2`, `data.path=...`, `seed=1`) are applied, by Hydra's own
    function and in their order, to a copy of the one composition of the others (the config groups' choices,
    the hydra node's keys; one composition serves with the node and without) in this process and cwd (which
    Hydra's node records), as Hydra applies them once it has merged the defaults list; the hydra node's record of
    the overrides is then Hydra's record of the whole list. With a config search path (whose files a test may
    change) the list is composed whole. A composition that fails is tried again each time. test_config.py's
    test_compose_cfg_is_hydras_composition holds the two ways equal."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    overrides = list(overrides or [])
    if any(o.lstrip("+~").startswith("hydra.searchpath") for o in overrides):
        return composed(overrides, return_hydra_config)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException:
        return composed(overrides, return_hydra_config)  # Hydra's own message
    choices = tuple(o.input_line for o in parsed if not applied_after_composing(o))
    cfg = copy.deepcopy(composed_once(choices, return_hydra_config, os.getcwd()))
    ConfigLoaderImpl._apply_overrides_to_config([o for o in parsed if applied_after_composing(o)], cfg)
    if return_hydra_config:  # as ConfigLoaderImpl._load_configuration_impl records them
        task = [o for o in parsed if not o.is_hydra_override()]
        cfg.hydra.overrides.task = [o.input_line for o in task]
        dirname = cfg.hydra.job.config.override_dirname
        cfg.hydra.job.override_dirname = get_overrides_dirname(task, dirname.exclude_keys, dirname.item_sep,
                                                               dirname.kv_sep)
    return cfg


def applied_after_composing(override) -> bool:
    """Whether Hydra applies `override` to the composed config rather than choosing a defaults-list entry with
    it: a key that names no config group (a key with a dot never does: Hydra's groups nest with `/`, and this
    app's top-level groups are conf/'s dirs); the hydra node's keys and sweeps are left to the composition."""
    key = override.key_or_group
    group = "/" in key or key == "hydra" or ("." not in key and (CONF / key).is_dir())
    return (not group and not key.startswith("hydra.") and override.package is None
            and not override.is_sweep_override())


@functools.cache
def composed_once(overrides: tuple[str, ...], return_hydra_config: bool, cwd: str):
    """Without the hydra node: the composition with it, the node deleted, as Hydra's compose deletes it."""
    if return_hydra_config:
        return composed(list(overrides), True)
    cfg = copy.deepcopy(composed_once(overrides, True, cwd))
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def composed(overrides: list[str], return_hydra_config: bool):
    registered_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=return_hydra_config)


def typed_run_config(cache_dir: Path, run_dir: Path, overrides: list[str]):
    """The checked run config of a small tiny run (SMALL_DATA, no wandb) with run dir `run_dir` and the cache
    `cache_dir`, as the launcher hands it to a rank."""
    from omegaconf import OmegaConf

    from eagle3.config import run_config

    plain = OmegaConf.to_container(compose_cfg([f"cache_dir={cache_dir}", "logger.mode=disabled", *SMALL_DATA,
                                                *overrides]), resolve=True, enum_to_str=True)
    assert isinstance(plain, dict)
    plain["run"] = {"dir": str(run_dir), "name": "t", "group": "t", "choices": {}, "overrides": []}
    return run_config(plain)


def small_run(cache_dir: Path, run_dir: Path, overrides: list[str]):
    """The pieces of a tiny run, built as the launcher builds them, for driving eagle3.train.loop.train directly."""
    import torch

    from eagle3.data.loader import LoaderSpec, build_loaders
    from eagle3.init import InitContext, build_draft
    from eagle3.run.inputs import materialize_inputs

    cfg = typed_run_config(cache_dir, run_dir, overrides)
    run_dir.mkdir(parents=True)
    verifier_dir, data_dir = materialize_inputs(cfg)
    draft = cfg.model.draft
    loaders = build_loaders(data_dir, LoaderSpec(cfg.data.total_seq_len, draft.hidden_size, len(draft.aux_layer_ids),
                                                 cfg.data.train_ratio, cfg.seed))
    torch.manual_seed(cfg.seed)  # as eagle3/train/rank.py seeds before the draft is built
    model, _ = build_draft(InitContext(draft, cfg.init, verifier_dir, data_dir, "sdpa", []))
    return cfg, model, loaders


def tiny_run_config(overrides: list[str] | None = None):
    """The typed run config of the tiny default with `overrides` and no wandb, as bench/common.py's
    tiny_run_config types it, composed by compose_cfg."""
    from omegaconf import OmegaConf

    from eagle3.config import run_config

    plain = OmegaConf.to_container(compose_cfg(["logger.mode=disabled", *(overrides or [])]), resolve=True,
                                   enum_to_str=True)
    assert isinstance(plain, dict)
    plain["run"] = {"dir": "", "name": "bench", "group": "bench", "choices": {}, "overrides": []}
    return run_config(plain)


def checked_config(overrides: list[str]):
    """The typed, checked config of `overrides`, as plan=true checks it (no dataset read)."""
    from omegaconf import OmegaConf

    from eagle3.config import validate

    plain = OmegaConf.to_container(compose_cfg(overrides), resolve=True, enum_to_str=True)
    return validate({str(k): v for k, v in plain.items()}, dataset_required=False)


# --- verifiers: a small model in memory, saved as a Hugging Face dir, or only its config.json --------------------

ARCHITECTURES = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "stablelm": "StableLm"}


def verifier_model(seed: int | None = 0, architecture: str = "llama", **config):
    """A randomly initialised causal LM of transformers' `architecture` (ARCHITECTURES' keys) whose config has the
    fields `config`, its weights drawn after torch.manual_seed(seed) (None: from the RNG as it stands)."""
    import torch
    import transformers

    name = ARCHITECTURES[architecture]
    if seed is not None:
        torch.manual_seed(seed)
    return getattr(transformers, f"{name}ForCausalLM")(getattr(transformers, f"{name}Config")(**config))


def verifier_dir(path: Path, seed: int | None = 0, architecture: str = "llama", tokenizer=None, **config) -> Path:
    """verifier_model(seed, architecture, **config) saved as a Hugging Face model dir at `path` (config.json,
    generation_config.json, model.safetensors), with `tokenizer`'s files when one is given: what model=auto,
    prepare, data=online and the engines read."""
    verifier_model(seed, architecture, **config).save_pretrained(str(path))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    return path


def verifier_config_dir(path: Path, **config) -> Path:
    """A verifier dir that holds only its config.json with the fields `config`, made with its parents (a config.json
    there is written over): what model=auto, the plan and the config checks read (no weights)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def own_verifier(path: Path) -> Path:
    """A Llama verifier of another shape than the tiny default's (hidden 96, 8 layers, 6 heads / 2 KV heads,
    vocab 800), saved as a Hugging Face model dir; no draft dimension of it appears anywhere else."""
    return verifier_dir(path, hidden_size=96, num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=2,
                        intermediate_size=160, vocab_size=800, max_position_embeddings=256, rope_theta=50000.0,
                        rms_norm_eps=1e-5)


# --- chat tokenizers: word-level, whitespace-split, with a chat template ------------------------------------------

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|> {% endif %}")


def chat_words(n: int) -> list[str]:
    """A chat vocabulary: [UNK], the role markers, <|end|>, then the words w0 .. w{n-1}."""
    return ["[UNK]", "<|user|>", "<|assistant|>", "<|end|>"] + [f"w{i}" for i in range(n)]


def chat_tokenizer(words: list[str], chat_template: str | None = CHAT_TEMPLATE, **special):
    """A transformers tokenizer whose ids are `words`' positions (whitespace-split, [UNK] for any other word),
    with `chat_template` (None: none) and the special tokens `special` (eos_token=...); save_pretrained writes it
    into a verifier dir."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", **special)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


# --- run dirs: what a run writes, as eagle3 reads it back -----------------------------------------------------------

def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summary_json(step0: dict, best: dict, final: dict, **fields) -> str:
    """A summary.json as a run writes it, with these val rows (tests that build run dirs by hand)."""
    from eagle3.rundir.progress import Progress, RunSummary

    summary = RunSummary.of(Progress(step=final.get("step", 0), step0=step0, best=best, final=final),
                            Path("/verifier"), Path("/data"), "cpu", 1)
    return json.dumps({**summary.to_dict(), **fields})


def fake_run_dir(tmp_path: Path, name: str, verifier: Path) -> Path:
    """A run dir as eagle3.serve reads it (summary, resolved config, a checkpoint dir that exists) of `verifier`."""
    import yaml
    from omegaconf import OmegaConf

    run = tmp_path / name
    ckpt = run / "checkpoints" / "best"
    for d, files in ((ckpt, ("config.json", "model.safetensors")), (verifier, ("config.json",))):
        d.mkdir(parents=True, exist_ok=True)
        for file_name in files:
            (d / file_name).write_text("{}")
    verifier_config_dir(verifier, vocab_size=100, max_position_embeddings=64)
    plain = OmegaConf.to_container(compose_cfg(["logger.mode=disabled"]), resolve=True, enum_to_str=True)
    plain["run"] = {"dir": str(run), "name": "t", "group": "t", "choices": {}, "overrides": []}
    (run / "resolved_config.yaml").write_text(yaml.safe_dump(plain))
    row = {"step": 4, "split": "val", "epoch": 0, "loss": 2.5, "tau_sim": 1.25}
    (run / "summary.json").write_text(summary_json(row, row, row, verifier_dir=str(verifier),
                                                   data_dir=str(tmp_path / "data")))
    return run


# A vLLM stand-in for eagle3.serve: answers the engine's metadata probe, then fails or hangs with a child as
# $FAKE_ENGINE_MODE says (the pids of its group appended to $FAKE_ENGINE_PGIDS).
FAKE_ENGINE = """#!/bin/bash
if [ "$1" = "-c" ]; then echo '{"engine": "vllm", "version": "0.0+fake", "torch": "0"}'; exit 0; fi
case "$FAKE_ENGINE_MODE" in
  fail) echo "RuntimeError: the fake engine cannot start"; exit 3 ;;
  hang) echo $$ >> "$FAKE_ENGINE_PGIDS"; sleep 1000 & sleep 1000 ;;
esac
"""


# --- a disk that fills up ---------------------------------------------------------------------------------------

def disk_full_after(files: int, monkeypatch) -> None:
    """safetensors' save_file as on a disk that fills up after `files` files: part of the next file is written,
    then safetensors' own error for ENOSPC."""
    import safetensors.torch
    from safetensors import SafetensorError

    real, written = safetensors.torch.save_file, []

    def save_file(tensors, filename, metadata=None):
        if len(written) >= files:
            Path(filename).write_bytes(b"\0" * 100)
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        written.append(filename)
        return real(tensors, filename, metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)


def disk_free(free: int, monkeypatch) -> None:
    """shutil.disk_usage as on a 10 GiB disk with `free` bytes left."""
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 * 2**30, 10 * 2**30 - free, free))


# --- a hidden-states dataset as prepare writes it, and speculators' own reading of it (the reader's tests) ---------

T, H, AUX, VOCAB = 48, 32, 3, 64
# Packs of several documents, documents of one token (nothing left after the shift), and two longer than a
# micro-batch (the sampler packs them alone and CollateFn cuts them at T).
LENGTHS = [1, 2, 5, 9, 12, 17, 20, 23, 30, 40, 60, 100, 3, 1, 7, 11, 14, 19, 25, 31, 36, 8, 6, 4, 13, 2, 16, 21]
RATIO = 0.75


def write_dataset(out: Path, dtype, seed: int = 0) -> Path:
    """A dataset dir as prepare writes it (Arrow rows of LENGTHS, hidden states of AUX + 1 layers of width H in
    `dtype`), random from `seed`."""
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, VOCAB, (n,), generator=gen) for n in LENGTHS]
    masks = [(torch.rand(n, generator=gen) > 0.3).long() for n in LENGTHS]
    (out / "hidden_states").mkdir(parents=True)
    for i, n in enumerate(LENGTHS):
        save_file({"hidden_states": torch.randn(n, AUX + 1, H, generator=gen).to(dtype), "token_ids": ids[i]},
                  str(out / "hidden_states" / f"hs_{i}.safetensors"))
    Dataset.from_dict({"input_ids": [t.tolist() for t in ids], "loss_mask": [m.tolist() for m in masks],
                       "seq_len": LENGTHS}).with_format("torch").save_to_disk(str(out))
    return out


class Speculators:
    """speculators' own path: ArrowDataset items through CollateFn(shift_batch), for any rows of the dataset."""

    def __init__(self, data_dir: Path, dtype):
        from speculators.models.eagle3.data import shift_batch
        from speculators.train.data import ArrowDataset, CollateFn

        # train_ratio=1: item i is row i of the whole dataset.
        self.items = ArrowDataset(max_len=T, datapath=str(data_dir), on_missing="raise", train_ratio=1.0,
                                  split="train", hidden_states_dtype=dtype)
        self.collate = CollateFn(T, H, num_target_layers=AUX, dtype=dtype, preprocess=shift_batch)

    def batch(self, rows) -> dict:
        import torch

        out = self.collate([self.items[int(r)] for r in rows])
        return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def passes(loader, epochs=(0, 1)):
    """(full-dataset rows, micro-batch) over whole passes of `loader`."""
    for epoch in epochs:
        loader.batch_sampler.set_epoch(epoch)
        plan = list(loader.batch_sampler)
        for docs, batch in zip(plan, loader, strict=True):
            yield [int(loader.split_rows[i]) for i in docs], batch


def draft_for_dataset(flags: dict):
    """A small draft (speculators' flags updated with `flags`) for write_dataset's rows: hidden H, vocabulary
    VOCAB (every other token in its draft vocabulary), seeded weights."""
    import torch

    from eagle3.config import SPECULATORS_FLAGS, DraftConfig
    from eagle3.init.build import bare_draft

    draft = {"vocab_size": VOCAB, "hidden_size": H, "intermediate_size": 64, "num_attention_heads": 2,
             "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 2 * T, "rope_theta": 10000.0,
             "rms_norm_eps": 1e-6, "hidden_act": "silu", "draft_vocab_size": 32, "aux_layer_ids": [1, 2, 3],
             "ttt_steps": 3}
    torch.manual_seed(0)
    model = bare_draft(DraftConfig(**draft), {**SPECULATORS_FLAGS, **flags}, "cpu", attn_impl="sdpa")
    ids = torch.arange(0, VOCAB, 2)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[ids] = True
    model.load_vocab_mappings(t2d, ids - torch.arange(len(ids)))
    with torch.no_grad():
        for p in (model.embed_tokens.weight, model.lm_head.weight, model.verifier_lm_head.weight):
            p.normal_(0, 0.5)
    return model.eval()


# --- a built draft against eagle3.plan.memory's counts and speculators' forward ------------------------------------

def parameter_groups(model, draft) -> dict[str, tuple[int, bool]]:
    """The built draft's parameters grouped under eagle3.plan.memory's names for `draft` (parameter_counts' keys):
    {name: (count, trainable)}."""
    from eagle3.plan.memory import parameter_counts

    names = parameter_counts(draft)
    out: dict[str, list] = {}
    for name, p in model.named_parameters():
        if name.startswith("layers.") and ".self_attn." in name and "_norm." not in name:
            key = "decoder layers: attention"
        elif name.startswith("layers.") and ".mlp." in name:
            key = "decoder layers: MLP"
        elif name.startswith(("embed_tokens", "lm_head", "verifier_lm_head", "verifier_norm", "fc.", "mask_hidden")):
            key = next(k for k in names if k.startswith(name.split(".")[0] + " "))
        else:
            key = "norms"
        entry = out.setdefault(key, [0, p.requires_grad])
        entry[0] += p.numel()
        assert entry[1] == p.requires_grad, name
    return {k: (n, trainable) for k, (n, trainable) in out.items()}


def assert_chain_equals_speculators_forward(draft, verifier, ids: list[int], aux_ids: list[int], k: int) -> list[int]:
    """Each of the k steps of eval.drafting's chain from the prompt `ids` equals speculators' TTT step on the
    sequence whose teacher-forced tokens are the draft's own proposals (same position ids, hidden state and token,
    no off-by-one); the chain's proposals."""
    import torch

    from eagle3.decoding.drafting import propose, verifier_pass

    m = len(ids) - 1
    drafts, logits = propose(draft, ids, verifier_pass(verifier, ids, aux_ids).aux[:m], k)
    seq = ids + drafts[:-1]  # speculators' step j at index m-1 embeds seq[m+j]: the draft's token j
    states = verifier_pass(verifier, seq, aux_ids)
    captured = []
    hook = draft.lm_head.register_forward_hook(lambda _m, _i, out: captured.append(out[0]))
    with torch.no_grad():
        draft(hidden_states=states.aux[:-1][None], input_ids=torch.tensor([seq[1:]]),
              document_ids=torch.zeros(1, len(seq) - 1, dtype=torch.long),
              position_ids=torch.arange(1, len(seq))[None], ttt_steps=k)
    hook.remove()
    for j in range(k):
        torch.testing.assert_close(logits[j], captured[j][m - 1], rtol=1e-5, atol=1e-5)
    return drafts


# Hidden-state files of two engines compared (eagle3 prepare --engine vllm against --engine transformers)
HIDDEN_STATE_TOLERANCE = 1e-5  # relative, per position: fp32 on a CPU in two implementations


def relative_differences(states, reference):
    """Per slot, the largest over positions of |states - reference| / |reference| (norms over the hidden size)."""
    diff = (states.double() - reference.double()).norm(dim=-1) / reference.double().norm(dim=-1).clamp_min(1e-30)
    return diff.amax(dim=0)


def worst_differences(data: Path, reference: Path, rows: int) -> list[float]:
    """relative_differences of every row's file in `data` against `reference`'s, the worst per slot; the token
    ids must be equal."""
    import torch
    from safetensors.torch import load_file

    worst = None
    for i in range(rows):
        a = load_file(str(data / "hidden_states" / f"hs_{i}.safetensors"))
        b = load_file(str(reference / "hidden_states" / f"hs_{i}.safetensors"))
        assert torch.equal(a["token_ids"], b["token_ids"]) and a["token_ids"].dtype == torch.long
        assert a["hidden_states"].shape == b["hidden_states"].shape and a["hidden_states"].dtype == torch.float32
        d = relative_differences(a["hidden_states"], b["hidden_states"])
        worst = d if worst is None else torch.maximum(worst, d)
    assert worst is not None
    return worst.tolist()
