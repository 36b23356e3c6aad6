"""Serve parity: what an engine will read from an exported drafter, checked against how the draft was trained.

One table of rules per engine, each rule the engine's own reading of the config and the tensor headers
(/work/shared/notes/serving.md, "Serve-parity checklist", P1-P16): the speculators format is checked as vLLM
reads it, the SpecForge layout as SGLang reads it. A rule answers None (as trained) or a problem; a `refuse`
rule stops the export with nothing written, a `warn` rule is printed. Only config dicts, safetensors headers and
the small d2t tensor are read (and the verifier's embed_tokens, where the export ships one).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.arch.rope import Rope, engine_keys, read_rope
from eagle3.config import DraftKind, kind_flag_problem
from eagle3.formats.tensorfile import TensorSpec

FLAGS = ("norm_before_residual", "norm_before_fc", "norm_output", "fc_norm")


@dataclass
class Served:
    """An export as an engine sees it, and the draft as it was trained."""
    config: dict[str, Any]            # the config.json to be written
    layer: dict[str, Any]             # its decoder layer's config: transformer_layer_config, or the top level
    tensors: dict[str, TensorSpec]    # the tensors to be written (names as written)
    d2t: list[int] | None             # d2t's values
    aux_ids: list[int]                # the draft's aux layers as trained (Hugging Face hidden_states indexing)
    rope: Rope                        # the draft's RoPE as trained
    verifier: dict[str, Any] | None   # the verifier's config.json (its text_config), when it is reachable here
    embed_equal: bool | None          # a shipped embed_tokens equals the verifier's (None: not compared)
    target: str | None                # the verifier's model_type (its config's, else from its architectures)

    @property
    def draft_vocab(self) -> int:
        head = self.tensors.get("lm_head.weight")
        return head.shape[0] if head else int(self.config.get("draft_vocab_size") or 0)


# --- SGLang's aux-layer offsets: the hidden_states ids it captures for the ids a SpecForge config.json lists ----

def _plus_one(ids: list[int]) -> list[int]:
    return [i + 1 for i in ids]


def _plus_one_if_first_is_one(ids: list[int]) -> list[int]:
    return _plus_one(ids) if ids and ids[0] == 1 else list(ids)


SGLANG_CAPTURE: dict[str, Callable[[list[int]], list[int]]] = {  # srt/models/*.py: set_eagle3_layers_to_capture
    **dict.fromkeys(("llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "glm4_moe"), _plus_one),
    **dict.fromkeys(("deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe_lite"), _plus_one_if_first_is_one),
}
ARCH_MODEL_TYPE = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
                   "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe",
                   "DeepseekV3ForCausalLM": "deepseek_v3", "DeepseekV2ForCausalLM": "deepseek_v2"}


def target_model_type(verifier: dict[str, Any] | None, architectures: list[str] | None) -> str | None:
    if verifier and verifier.get("model_type"):
        return str(verifier["model_type"])
    return next((ARCH_MODEL_TYPE[a] for a in architectures or () if a in ARCH_MODEL_TYPE), None)


def sglang_aux_ids(ids: list[int], model_type: str | None) -> list[int]:
    """The ids to write in a SpecForge config.json so that SGLang captures the trained `ids` (Llama's rule for
    an unknown target)."""
    capture = SGLANG_CAPTURE.get(model_type or "llama", _plus_one)
    return next((c for c in ([i - 1 for i in ids], list(ids)) if capture(c) == list(ids)), [i - 1 for i in ids])


# --- the rules ---------------------------------------------------------------------------------------------------

def _architecture_vllm(s: Served) -> str | None:
    algorithm = (s.config.get("speculators_config") or {}).get("algorithm")
    kind = s.config.get("speculators_model_type")
    if kind not in ("eagle3", "peagle") or algorithm != kind:
        return (f"speculators_model_type={kind!r}, algorithm={algorithm!r}: vLLM selects EAGLE-3 by 'eagle3' in "
                "both, P-EAGLE (parallel drafting) by 'peagle'")
    return None


def _parallel(s: Served) -> bool:
    return s.config.get("speculators_model_type") == "peagle"


def _parallel_drafting(s: Served) -> str | None:
    """vLLM's P-EAGLE reads mask_token_id and mask_hidden, and takes the draft's own (trained) embed_tokens; its
    config reader copies norm_before_residual and norm_before_fc only (no fc_norm)."""
    if not _parallel(s):
        return None
    problems = []
    if not isinstance(s.config.get("mask_token_id"), int):
        problems.append(f"mask_token_id={s.config.get('mask_token_id')!r}: vLLM's masked slots read it")
    for name in ("mask_hidden", "embed_tokens.weight"):
        if name not in s.tensors:
            problems.append(f"{name} is missing: P-EAGLE trained it and vLLM reads it")
    flags = kind_flag_problem(DraftKind.peagle, s.config)
    if flags:
        problems.append(flags)
    return "; ".join(problems) or None


def _architecture_sglang(s: Served) -> str | None:
    if s.config.get("architectures") != ["LlamaForCausalLMEagle3"]:
        return f"architectures={s.config.get('architectures')}: SGLang loads ['LlamaForCausalLMEagle3']"
    return None


def _proposal(s: Served) -> str | None:
    spec = s.config.get("speculators_config") or {}
    methods = spec.get("proposal_methods") or [{}]
    k = methods[0].get("speculative_tokens")
    if not isinstance(k, int) or k < 1:
        return f"speculators_config.proposal_methods[0].speculative_tokens={k!r}: vLLM takes k from it"
    return None


def _verifier_name(s: Served) -> str | None:
    name = ((s.config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    if not name:
        return ("speculators_config.verifier.name_or_path is empty: `vllm serve <draft>` has no verifier to load; "
                "pass --verifier <hub id or path to serve with>")
    if Path(str(name)).is_absolute():
        return (f"speculators_config.verifier.name_or_path={name!r} is a local absolute path: `vllm serve <draft>` "
                "loads it, and fails on another machine; pass --verifier <hub id or path to serve with>")
    return None


def _layer_type(allowed: tuple[str, ...]) -> Callable[[Served], str | None]:
    def check(s: Served) -> str | None:
        kind = s.layer.get("model_type")
        return None if kind in allowed else f"decoder model_type={kind!r}: the engine builds {' or '.join(allowed)}"
    return check


def _one_layer(s: Served) -> str | None:
    n = s.layer.get("num_hidden_layers", 1)
    return None if n == 1 else f"num_hidden_layers={n}: SGLang's EAGLE-3 draft loads one decoder layer (midlayer)"


def _flags_explicit(s: Served) -> str | None:
    missing = [k for k in FLAGS if not isinstance(s.config.get(k), bool)]
    return (f"{', '.join(missing)} not stated: vLLM reads a missing norm_before_residual as true, speculators "
            "as false") if missing else None


def _no_norm_before_residual(s: Served) -> str | None:
    if s.config.get("norm_before_residual"):
        return ("norm_before_residual=true: SGLang's EAGLE-3 layer has no such flag (it always adds the raw "
                "hidden state): serve this draft with vLLM in the speculators format")
    return None


def _aux_ids_vllm(s: Served) -> str | None:
    ids = s.config.get("eagle_aux_hidden_state_layer_ids")
    return None if ids == s.aux_ids else (f"eagle_aux_hidden_state_layer_ids={ids}: vLLM would feed the draft "
                                          f"layers {ids}, it was trained on {s.aux_ids}")


def _aux_ids_sglang(s: Served) -> str | None:
    written = (s.config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not isinstance(written, list):
        return "eagle_config.eagle_aux_hidden_state_layer_ids missing: SGLang reads only it (else [2, N//2, N-3])"
    captured = SGLANG_CAPTURE.get(s.target or "llama", _plus_one)(written)
    if captured != s.aux_ids:
        return (f"eagle_config ids {written}: SGLang captures {captured} for a {s.target} target, trained on "
                f"{s.aux_ids}")
    return None


def _aux_offset_known(s: Served) -> str | None:
    if s.target not in SGLANG_CAPTURE:
        return (f"SGLang's aux-layer offset for a {s.target or 'unknown'} target is not known here: eagle_config ids "
                "were written by Llama's rule (captured id = written + 1)")
    return None


def _fc_width(s: Served) -> str | None:
    fc = s.tensors.get("fc.weight")
    hidden = s.config.get("target_hidden_size") or s.layer.get("hidden_size")
    ids = (s.config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids",
                                                    s.config.get("eagle_aux_hidden_state_layer_ids"))
    if fc is None or hidden is None or not isinstance(ids, list) or fc.shape[1] != len(ids) * hidden:
        return f"fc.weight {list(fc.shape) if fc else None}: the engine sizes fc from {ids} x hidden {hidden}"
    return None


def _lm_head(s: Served) -> str | None:
    head, vocab = s.tensors.get("lm_head.weight"), s.layer.get("vocab_size")
    if head is None or head.shape != (s.draft_vocab, s.layer.get("hidden_size")):
        return "lm_head.weight missing or not [draft_vocab, hidden]: the engine would use the target's head"
    declared = s.config.get("draft_vocab_size")
    if declared != s.draft_vocab and s.draft_vocab < (vocab or 0):
        return f"draft_vocab_size={declared}, lm_head has {s.draft_vocab} rows: the engine reads the former"
    return None


def _embed_tokens(equal: bool | None, problem: str) -> Callable[[Served], str | None]:
    """`problem` where an EAGLE-3 export ships embed_tokens and its comparison with the verifier's gave `equal`
    (None: not compared); P-EAGLE ships its own, trained one."""
    def check(s: Served) -> str | None:
        shipped = "embed_tokens.weight" in s.tensors and not _parallel(s)
        return problem if shipped and s.embed_equal is equal else None
    return check


def _untied(s: Served) -> str | None:
    tied = [k for k, v in (("tie_word_embeddings", s.config.get("tie_word_embeddings")),
                           ("decoder tie_word_embeddings", s.layer.get("tie_word_embeddings"))) if v is not False]
    return f"{', '.join(tied)} not false: SGLang then takes lm_head = embed_tokens" if tied else None


def _spec(spec: TensorSpec | None) -> str:
    return "missing" if spec is None else f"{spec.dtype} {list(spec.shape)}"


def _vocab(s: Served) -> str | None:
    vocab = int(s.layer.get("vocab_size") or 0)
    if s.verifier and vocab != s.verifier.get("vocab_size"):
        return f"vocab_size={vocab}, the verifier's {s.verifier.get('vocab_size')}: logits land on other tokens"
    if s.draft_vocab == vocab:
        return None
    d2t, t2d = s.tensors.get("d2t"), s.tensors.get("t2d")
    if d2t is None or d2t.dtype != "I64" or d2t.shape != (s.draft_vocab,) or s.d2t is None:
        return f"d2t {_spec(d2t)}: the engine needs int64 of the draft vocabulary's length ({s.draft_vocab})"
    ids = [i + o for i, o in enumerate(s.d2t)]
    if any(b <= a for a, b in zip(ids, ids[1:])) or min(ids) < 0 or max(ids) >= vocab:
        return f"d2t: the target ids i + d2t[i] are not ascending, unique and in [0, {vocab})"
    if t2d is None or t2d.dtype != "BOOL" or t2d.shape != (vocab,):
        return f"t2d {_spec(t2d)}: expected bool [{vocab}]"
    return None


def _rope_schemas(top_level: bool) -> Callable[[Served], str | None]:
    def check(s: Served) -> str | None:
        wanted = engine_keys(s.rope)
        place = s.config if top_level else s.layer
        wrong = [k for k, v in wanted.items() if place.get(k) != v]
        if wrong or read_rope(place) != s.rope:
            return f"RoPE keys {', '.join(wrong) or 'inconsistent'}: the draft was trained with {s.rope}"
        return None
    return check


def _rope_is_verifiers(s: Served) -> str | None:
    theirs = read_rope(s.verifier) if s.verifier else None
    if theirs is not None and theirs != s.rope:
        return f"the draft was trained with {s.rope}, the verifier uses {theirs}"
    return None


def _max_positions(engine: str) -> Callable[[Served], str | None]:
    def check(s: Served) -> str | None:
        ours, theirs = s.layer.get("max_position_embeddings"), (s.verifier or {}).get("max_position_embeddings")
        if ours is None or theirs is None or ours >= theirs:
            return None
        capped = (s.rope.scaling or {}).get("rope_type") in ("yarn", "dynamic", "longrope")
        what = {"vllm": "caps the server's max_model_len to it" if capped else "raises it to the verifier's",
                "sglang": "uses it as is"}[engine]
        return f"max_position_embeddings={ours} < the verifier's {theirs}: {what}"
    return check


SGLANG_NAMES = re.compile(r"(fc\.(weight|bias)|norm\.weight|lm_head\.weight|d2t|t2d|fc_norm\.\d+\.weight"
                          r"|midlayer\.(input_layernorm|hidden_norm|post_attention_layernorm)\.weight"
                          r"|midlayer\.self_attn\.[qkvo]_proj\.(weight|bias)|midlayer\.mlp\.(gate|up|down)_proj\.weight"
                          r"|input_norm\.weight)")
SGLANG_REQUIRED = ("fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d")


def _sglang_names(s: Served) -> str | None:
    unknown = sorted(k for k in s.tensors if not SGLANG_NAMES.fullmatch(k))
    missing = [k for k in SGLANG_REQUIRED if k not in s.tensors]
    if unknown or missing:
        return (f"SGLang skips unknown tensors silently (random init, acceptance 1.00): unknown {unknown}, "
                f"missing {missing}")
    return None


@dataclass(frozen=True)
class Rule:
    name: str
    severity: str   # refuse | warn
    check: Callable[[Served], str | None]


def _rules(engine: str, own: list[Rule], *, rope_top_level: bool, names: tuple[Rule, ...] = (),
           embed: tuple[Rule, ...] = ()) -> list[Rule]:
    """`engine`'s rules: its `own` first, then the rules on the shapes every engine reads alike, with its rules on
    tensor `names` after fc width and on a shipped `embed`_tokens after lm_head."""
    return [*own, Rule("fc width", "refuse", _fc_width), *names, Rule("lm_head", "refuse", _lm_head), *embed,
            Rule("tied", "refuse", _untied), Rule("vocabulary", "refuse", _vocab),
            Rule("rope", "refuse", _rope_schemas(top_level=rope_top_level)),
            Rule("rope", "warn", _rope_is_verifiers), Rule("positions", "warn", _max_positions(engine))]


RULES: dict[str, list[Rule]] = {
    "vllm": _rules("vllm", [
        Rule("architecture", "refuse", _architecture_vllm),
        Rule("parallel drafting", "refuse", _parallel_drafting),
        Rule("proposal", "refuse", _proposal),
        Rule("verifier", "warn", _verifier_name),
        Rule("decoder", "refuse", _layer_type(("llama", "qwen3"))),
        Rule("norm flags", "refuse", _flags_explicit),
        Rule("aux layers", "refuse", _aux_ids_vllm),
    ], rope_top_level=False, embed=(
        Rule("embed_tokens", "refuse", _embed_tokens(False, "embed_tokens differs from the verifier's: vLLM keeps "
                                                            "a shipped embed_tokens that differs")),
        Rule("embed_tokens", "warn", _embed_tokens(None, "embed_tokens is shipped and the verifier's weights are "
                                                         "not here to compare: vLLM keeps it where it differs "
                                                         "from the verifier's")),
    )),
    "sglang": _rules("sglang", [
        Rule("architecture", "refuse", _architecture_sglang),
        Rule("decoder", "refuse", _layer_type(("llama",))),
        Rule("decoder", "refuse", _one_layer),
        Rule("norm flags", "refuse", _no_norm_before_residual),
        Rule("aux layers", "refuse", _aux_ids_sglang),
        Rule("aux layers", "warn", _aux_offset_known),
    ], rope_top_level=True, names=(Rule("tensor names", "refuse", _sglang_names),)),
}


def check_served(engine: str, served: Served) -> tuple[list[str], list[str]]:
    """(refusals, warnings) of `engine`'s rules, each as '<engine>, <rule>: <problem>'."""
    found: dict[str, list[str]] = {"refuse": [], "warn": []}
    for rule in RULES[engine]:
        problem = rule.check(served)
        if problem:
            found[rule.severity].append(f"{engine}, {rule.name}: {problem}")
    return found["refuse"], found["warn"]
