"""The draft's shape read from the verifier's config.json, for `model=auto` (OmegaConf resolvers).

    draft:
      hidden_size: ${verifier_config:${..verifier.path},hidden_size}

`verifier_config` returns a key of `<path>/config.json` (of its `text_config` for multimodal configs), or one
derived from it where configs differ in how they state it:
  head_dim              config's head_dim, else hidden_size // num_attention_heads
  num_key_value_heads   config's, else num_attention_heads (no grouped-query attention)
  rope_theta            rope_parameters.rope_theta (transformers 5 stores it there), else the config's rope_theta
  rope_scaling          rope_type and its factors from rope_parameters or rope_scaling; null for default RoPE
  partial_rotary_factor from rope_parameters or the top level, else 1.0 (eagle3/arch/rope.py reads both schemas)
  hidden_act            config's, else silu
  draft_vocab_size      min(32000, vocab_size): EAGLE-3's and SpecForge's draft vocabulary
  aux_layer_ids         EAGLE-3's [2, N//2, N-3] for N = num_hidden_layers (Hugging Face output_hidden_states
                        indexing; SpecForge writes [1, N//2-1, N-4] for the same layers)
A missing path, an unreadable file or a missing key is a ConfigError naming the key to set by hand.

The config is read and checked by eagle3.verifier.model.Verifier (a config no model could have, LayerNorm norms),
the one reader of a verifier's config.json. Imports nothing heavy: `launch.py --cfg job` resolves nothing, and the
run config resolves this once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eagle3.arch.rope import Rope, RopeError, read_rope
from eagle3.config import check_aux_layers
from eagle3.errors import ConfigError
from eagle3.verifier.model import Verifier

if TYPE_CHECKING:
    from eagle3.config import ModelConfig

DRAFT_VOCAB_CAP = 32000  # draft tokens at most: EAGLE-3's and SpecForge's default draft vocabulary


def verifier_config(path: Any, key: str) -> Any:
    """The draft dimension `key` for the verifier at `path` (the `verifier_config` resolver)."""
    if path is None or not str(path).strip():
        raise ConfigError("model=auto reads the draft's shape from the verifier's config.json: set "
                          "model.verifier.path=<a local Hugging Face model dir>")
    verifier = Verifier(path, why=" (model=auto reads the draft's shape from it)")
    config, file = verifier.config, verifier.file
    derive = DERIVED.get(key)
    value = derive(config) if derive else config.get(key)
    if value is None and key not in NULLABLE:
        raise ConfigError(f"{file} has no {key} (model=auto reads the draft's {key} from it); set "
                          f"model.draft.{key}=... on the command line")
    return value


def default_aux_layer_ids(num_layers: int, how_to_set: str = "set model.draft.aux_layer_ids=[...]") -> list[int]:
    """EAGLE-3's choice, low, middle and high: [2, N//2, N-3] in output_hidden_states indexing (SpecForge counts
    layer outputs and writes [1, N//2-1, N-4] for the same layers). The one definition: model=auto derives the
    draft's ids with it, and data preparation its default --aux-layer-ids. `how_to_set` ends the message for a
    verifier with too few layers (the caller's own option)."""
    ids = [2, num_layers // 2, num_layers - 3]
    if len(set(ids)) < 3 or min(ids) < 1:
        raise ConfigError(f"the verifier has {num_layers} layers, too few for the default aux layers "
                          f"[2, N//2, N-3] = {ids}: {how_to_set}")
    return ids


def _head_dim(c: dict[str, Any]) -> int | None:
    if c.get("head_dim"):
        return c["head_dim"]
    if c.get("hidden_size") and c.get("num_attention_heads"):
        return c["hidden_size"] // c["num_attention_heads"]
    return None


def _rope(c: dict[str, Any]) -> Rope | None:
    try:
        return read_rope(c)
    except RopeError as e:
        raise ConfigError(f"the verifier's config.json states {e}; a one-layer draft has one RoPE: set "
                          "model.draft.rope_theta, model.draft.rope_scaling and model.draft.partial_rotary_factor "
                          "on the command line") from None


def _aux_layer_ids(c: dict[str, Any]) -> list[int] | None:
    layers = c.get("num_hidden_layers")
    return None if layers is None else default_aux_layer_ids(layers)


DERIVED = {
    "head_dim": _head_dim,
    "num_key_value_heads": lambda c: c.get("num_key_value_heads") or c.get("num_attention_heads"),
    "rope_theta": lambda c: None if (rope := _rope(c)) is None else rope.theta,
    "rope_scaling": lambda c: None if (rope := _rope(c)) is None else rope.scaling,
    "partial_rotary_factor": lambda c: None if (rope := _rope(c)) is None else rope.partial_rotary_factor,
    "hidden_act": lambda c: c.get("hidden_act") or "silu",
    "draft_vocab_size": lambda c: None if c.get("vocab_size") is None else min(DRAFT_VOCAB_CAP, c["vocab_size"]),
    "aux_layer_ids": _aux_layer_ids,
}
NULLABLE = {"rope_scaling"}  # null is a value: default RoPE


def unresolvable(error: Exception) -> str:
    """One message for a ${...} the run config cannot resolve (a ConfigError raised here, or a missing key)."""
    text = str(error).split("\n")[0].removeprefix("ConfigError raised while resolving interpolation: ")
    if "verifier.tiny" in text:  # model=tiny's draft is sized after its own tiny verifier
        text += ("; model=tiny builds its own verifier (model.verifier.tiny): for your own verifier use model=auto "
                 "model.verifier.path=<dir>, which reads the draft's shape from its config.json")
    key = getattr(error, "full_key", None)
    # Messages that already name the key to set start with it ("model.verifier.path: ..."); others get it.
    return text if text.startswith("model") or not key else f"{key}: {text}"


def register_resolvers() -> None:
    from hydra.errors import CompactHydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError

    class Unresolvable(InterpolationResolutionError, CompactHydraException):
        """verifier_config's ConfigError as OmegaConf passes it on unwrapped (an InterpolationResolutionError) and
        Hydra reports it, e.g. for `--cfg job --resolve`: as one message (a CompactHydraException), no traceback."""

    def resolve(path: Any, key: str) -> Any:
        try:
            value = verifier_config(path, key)
        except ConfigError as e:
            raise Unresolvable(str(e)) from None
        # A dict (rope_scaling) as a DictConfig: `--cfg job --resolve` puts resolved values back into the config,
        # where a plain dict fails.
        return OmegaConf.create(value) if isinstance(value, dict) else value

    if not OmegaConf.has_resolver("verifier_config"):
        OmegaConf.register_new_resolver("verifier_config", resolve)


def check_verifier_dir(model: ModelConfig) -> None:
    """What the schema's own checks (eagle3.config, which reads no file's contents) leave to the verifier dir: its
    config.json read and checked (a config no model could have, a LayerNorm verifier: one ConfigError), and the
    draft's aux_layer_ids within its decoder layers."""
    if model.verifier.path is None:
        return
    layers = Verifier(model.verifier.path).config.get("num_hidden_layers")
    if isinstance(layers, int):
        check_aux_layers(model.draft.aux_layer_ids, layers)
