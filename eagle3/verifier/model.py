"""A verifier as eagle3 reads it: a local Hugging Face causal LM dir, asked through one `Verifier(path)`.

    verifier = Verifier(path)              # key: the option that gave the dir, which every message names
    verifier.config                        # config.json's decoder part, checked (below)
    verifier.fingerprint()                 # the identity recorded with prepared data
    verifier.positions, verifier.eos_ids() # a row's bound; the end-of-sequence ids
    verifier.chat_tokenizer()              # its tokenizer with its chat template (formats.row_formats.ChatTokenizer)
    verifier.transformers_config()         # transformers' config (no weights read)
    verifier.weight_files()                # its safetensors files (eagle3.formats.tensorfile.weight_files)
    verifier.load(device, dtype)           # the causal LM, eval mode

This is the one module that opens a verifier's config.json: it is read once per process while it is unchanged
(keyed by its modification time and size), and every other module asks a Verifier. A missing or unreadable
config.json is one ConfigError naming the option that gave the dir.

`Verifier.config` refuses, once, a config no model could have (a size that is not a positive integer, key/value
heads that do not divide the query heads, a hidden size the heads do not divide) and a verifier whose norms are
LayerNorm, which the draft cannot mirror (speculators' Eagle3DraftModel computes its targets through the
verifier's final norm as an RMSNorm). The raw reads (`raw`, `text`, `fingerprint`) do not: preparing data needs
no draft. A multimodal wrapper's (Kimi-K2.5, Qwen3-VL) decoder is its `text_config`.

Imports nothing heavy at module level (torch and transformers inside the methods that need them): the launcher's
light paths (`--cfg job`, the model=auto resolver) read the config through here.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3.config import shape_problems
from eagle3.errors import ConfigError, DataError, load_problem
from eagle3.formats.tensorfile import HeaderError, WeightFilesError, read_specs, weight_files

if TYPE_CHECKING:
    import torch

    from eagle3.formats.row_formats import ChatTokenizer

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
# Keys of config.json that differ between copies of the same weights (saved by another transformers version, in
# another dtype, from another path): the fingerprint's hash must not.
VOLATILE_KEYS = {"transformers_version", "_name_or_path", "torch_dtype", "dtype", "use_cache"}
# The epsilon keys of configs whose norms are LayerNorm (StableLM, GPT-NeoX, Phi: layer_norm_eps; Falcon, GPT-2:
# layer_norm_epsilon; StarCoder2: norm_epsilon). An RMSNorm decoder states rms_norm_eps.
LAYER_NORM_KEYS = ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")


class Verifier:
    """The verifier in the local Hugging Face model dir `path`. `key` names the option that gave it
    (model.verifier.path, --model, --verifier) in every message; `why` follows "has no config.json" in the
    message for a dir without one."""

    def __init__(self, path: str | Path, key: str = "model.verifier.path", why: str = ""):
        self.path, self.key, self.why = Path(str(path)), key, why

    def __repr__(self) -> str:
        return f"Verifier({str(self.path)!r})"

    @property
    def file(self) -> Path:
        return self.path / CONFIG

    def exists(self) -> bool:
        """Whether the dir has a config.json (nothing read)."""
        return self.file.is_file()

    @cached_property
    def raw(self) -> dict[str, Any]:
        """config.json as written (a JSON object), unchecked."""
        try:
            stat = os.stat(self.file)
        except OSError:
            raise ConfigError(f"{self.key}: {self.path} has no {CONFIG}{self.why}; expected a local Hugging Face "
                              f"model dir") from None
        try:
            return _read_json(str(self.file), stat.st_mtime_ns, stat.st_size)
        except _Unreadable as e:
            raise ConfigError(f"{self.key}: {self.file}: {e}") from None

    @property
    def text(self) -> dict[str, Any]:
        """The decoder's part of config.json (a multimodal wrapper's text_config), unchecked."""
        return decoder_config(self.raw)

    @cached_property
    def config(self) -> dict[str, Any]:
        """The decoder's part of config.json, checked: a ConfigError for a decoder no model could have and for
        LayerNorm norms (see the module's docstring)."""
        config = self.text
        problems = shape_problems(config)
        if problems:
            raise ConfigError(f"{self.key}: {self.file} describes a decoder no model could have: "
                              f"{'; '.join(problems)}")
        norm = layer_norm_key(config)
        if norm:
            raise ConfigError(f"{self.key}: {self.file} describes a verifier with LayerNorm norms ({norm}, "
                              f"model_type {config.get('model_type')!r}), and the EAGLE-3 draft can mirror only "
                              f"RMSNorm: speculators computes the draft's targets through the verifier's final norm "
                              f"as an RMSNorm, so it would train against logits this verifier never gives. Use an "
                              f"RMSNorm verifier (Llama, Qwen, Mistral, Gemma, DeepSeek-V3 style: config.json has "
                              f"rms_norm_eps)")
        return config

    def size(self, key: str) -> int | None:
        """The decoder's `key` (vocab_size, hidden_size, num_hidden_layers, ...) when config.json states it as an
        integer, else None."""
        value = self.text.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def positions(self) -> int | None:
        """max_position_embeddings (None when config.json does not say): a row's bound."""
        return self.size("max_position_embeddings")

    @property
    def quantized(self) -> bool:
        return "quantization_config" in self.raw or "quantization_config" in self.text

    def fingerprint(self) -> dict[str, Any]:
        """The verifier's identity as recorded with prepared data: a hash of its config.json (less the keys that
        differ between copies of the same weights) and the sizes that matter."""
        stable = {k: v for k, v in self.raw.items() if k not in VOLATILE_KEYS}
        digest = hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:16]
        text = self.text
        return {"path": str(self.path), "config_hash": digest, "model_type": self.raw.get("model_type"),
                "num_hidden_layers": text.get("num_hidden_layers"), "hidden_size": text.get("hidden_size"),
                "vocab_size": text.get("vocab_size")}

    def eos_ids(self) -> list[int]:
        """The end-of-sequence ids, as transformers and vLLM take them: generation_config.json's, else
        config.json's (its decoder's); none when neither says."""
        eos = None
        generation = self.path / GENERATION_CONFIG
        if generation.is_file():
            try:
                eos = json.loads(generation.read_text()).get("eos_token_id")
            except (OSError, ValueError, AttributeError) as e:
                raise ConfigError(f"{self.key}: {generation}: cannot read it ({e})") from None
        if eos is None and self.exists():
            eos = self.raw.get("eos_token_id", self.text.get("eos_token_id"))
        return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)

    def transformers_config(self):
        """transformers' config of the model (no weights read), built once per Verifier; code in the dir is never
        run (trust_remote_code=False): a model type transformers does not know is one ConfigError."""
        return self._transformers_config

    @cached_property
    def _transformers_config(self):
        from transformers import AutoConfig

        self.raw  # noqa: B018  (a missing or unreadable config.json: this module's message, not transformers')
        try:
            return AutoConfig.from_pretrained(str(self.path), trust_remote_code=False)
        except Exception as e:  # noqa: BLE001  (transformers raises many types for a bad dir)
            raise ConfigError(f"{self.key}: {self.path}'s {CONFIG} cannot be loaded ({load_problem(e)})") from None

    def chat_tokenizer(self) -> ChatTokenizer:
        """Its tokenizer with its chat template, which renders conversations (messages or ShareGPT rows); a
        DataError when it does not load or has no chat template. Code in the dir (a tokenizer class of its own,
        named by auto_map) is never run."""
        from transformers import AutoTokenizer

        from eagle3.formats.row_formats import ChatTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(self.path), trust_remote_code=False)
        except (OSError, ValueError) as e:
            has_files = self.path.is_dir() and any(p.name.startswith("tokenizer") for p in self.path.iterdir())
            reason = load_problem(e) if has_files else "no tokenizer files in the dir"
            raise DataError(f"{self.path}: conversations need the model's tokenizer, which did not load ({reason}); "
                            f"give input_ids rows instead") from None
        return ChatTokenizer(tokenizer, self.path)

    def weight_files(self) -> list[Path]:
        """Its safetensors files: the shards its index names, else model.safetensors (pickles are never loaded)."""
        try:
            return weight_files(self.path)
        except WeightFilesError as e:
            raise ConfigError(f"{self.key}: {e}") from None

    def check_weights(self) -> None:
        """The weights are there and whole: each safetensors file's header read and checked against the file's
        size (not safetensors, truncated). Headers only, no weights read."""
        for file in self.weight_files():
            fd = os.open(file, os.O_RDONLY)
            try:
                read_specs(fd)
            except HeaderError as e:
                raise ConfigError(f"{self.key}: {file} cannot be loaded: {e}") from None
            finally:
                os.close(fd)

    def load(self, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> torch.nn.Module:
        """The causal LM, eval mode, on `device`, in `dtype` (fp32 by default); one ConfigError naming the key and
        the dir when it cannot be loaded, or when its weights lack a tensor its config describes (transformers
        would initialize it at random and only warn). Safetensors only: a pickle is never loaded."""
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as transformers_logging

        config = self.transformers_config()
        # Its load report (a table of missing and unexpected keys, logged as a warning) is replaced by the one
        # message below for what matters: missing weights.
        verbosity = transformers_logging.get_verbosity()
        transformers_logging.set_verbosity_error()
        try:
            model, loading = AutoModelForCausalLM.from_pretrained(
                str(self.path), config=config, dtype=dtype or torch.float32, output_loading_info=True,
                use_safetensors=True, trust_remote_code=False)
        except Exception as e:  # noqa: BLE001  (transformers and safetensors raise many types for a bad dir)
            raise ConfigError(f"{self.key}: {self.path} cannot be loaded as a Hugging Face causal LM "
                              f"({load_problem(e)})") from None
        finally:
            transformers_logging.set_verbosity(verbosity)
        # Tied weights (lm_head = embed_tokens) are not reported missing.
        missing = sorted(loading.get("missing_keys") or [])
        if missing:
            raise ConfigError(f"{self.key}: {self.path}'s weights lack {len(missing)} of the tensors its "
                              f"{CONFIG} describes ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): "
                              f"an incomplete or mismatched checkpoint")
        return model.to(device).eval()


class _Unreadable(Exception):
    pass


@lru_cache(maxsize=8)
def _read_json(file: str, mtime_ns: int, size: int) -> dict[str, Any]:
    """The parsed config.json (keyed by its modification time and size too: a rewritten file is read again).
    Shared by every Verifier of the file: read it, never change it."""
    try:
        config = json.loads(Path(file).read_text())
    except (OSError, ValueError) as e:
        raise _Unreadable(f"cannot read the verifier's config ({e})") from None
    if not isinstance(config, dict):
        raise _Unreadable("not a Hugging Face config (not a JSON object)")
    return config


def decoder_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a parsed config.json: a multimodal wrapper's (Kimi-K2.5, Qwen3-VL)
    `text_config`, else the config itself. Every reader of a verifier's sizes takes them through this."""
    text = config.get("text_config")
    return text if isinstance(text, dict) and text else config


def layer_norm_key(config: dict[str, Any]) -> str | None:
    """The LayerNorm epsilon key `config` states (its norms are LayerNorm, not RMSNorm), or None."""
    if "rms_norm_eps" in config:
        return None
    return next((key for key in LAYER_NORM_KEYS if key in config), None)

