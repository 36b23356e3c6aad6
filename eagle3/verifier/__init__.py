"""Verifiers as a user has them, made into what the rest of eagle3 loads: a local Hugging Face causal LM dir
(config.json, safetensors weights, the tokenizer with its chat template).

    python -m eagle3.verifier from-gguf FILE OUT     # a GGUF file (llama.cpp's format) -> an fp32 safetensors dir
"""
