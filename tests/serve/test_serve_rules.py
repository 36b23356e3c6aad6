"""The rules on what every engine reads alike (fc width, lm_head, tied embeddings, vocabulary, RoPE against the
verifier's) say the same of the same export for vLLM and SGLang; a shipped embed_tokens is vLLM's concern."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_export_parity import drop, good, plan, set_config, verifier  # noqa: F401  (the fixtures)

from eagle3.serve.parity import check_served


def problems(engine: str, served, rule: str) -> list[str]:
    refusals, warnings = check_served(engine, served)
    return [p.split(": ", 1)[1] for p in refusals + warnings if p.startswith(f"{engine}, {rule}: ")]


@pytest.mark.parametrize("rule, edit", [
    ("fc width", lambda s: replace(s, layer={**s.layer, "hidden_size": 16}, config={**s.config,
                                                                                    "target_hidden_size": 16})),
    ("lm_head", drop("lm_head.weight")),
    ("tied", set_config(tie_word_embeddings=True)),
    ("vocabulary", drop("d2t")),
    ("rope", lambda s: replace(s, rope=replace(s.rope, theta=1.0))),
])
def test_a_shape_rule_says_the_same_for_both_engines(good, rule, edit):  # noqa: F811
    vllm, sglang = (edit(plan(good, fmt)) for fmt in ("speculators", "specforge"))
    said = {engine: problems(engine, served, rule) for engine, served in (("vllm", vllm), ("sglang", sglang))}
    assert said["vllm"] and said["sglang"], said
    # the problem's own words, but for the aux ids and RoPE keys each engine's config writes in its place
    assert [p.split(":")[0] for p in said["vllm"]] == [p.split(":")[0] for p in said["sglang"]], said


def test_an_uncompared_embed_tokens_is_a_vllm_warning_and_a_differing_one_a_refusal(good):  # noqa: F811
    served = plan(good, "speculators")
    assert "embed_tokens.weight" in served.tensors
    refusals, warnings = check_served("vllm", replace(served, embed_equal=None))
    assert not [r for r in refusals if "embed_tokens" in r]
    assert any(w.startswith("vllm, embed_tokens: embed_tokens is shipped and the verifier's weights are not here")
               for w in warnings)
    refusals, _ = check_served("vllm", replace(served, embed_equal=False))
    assert any(r.startswith("vllm, embed_tokens: embed_tokens differs") for r in refusals)
    peagle = replace(served, embed_equal=False, config={**served.config, "speculators_model_type": "peagle"})
    assert not problems("vllm", peagle, "embed_tokens")
    assert not problems("sglang", replace(plan(good, "specforge"), embed_equal=False), "embed_tokens")
