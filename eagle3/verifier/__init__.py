"""The verifier: its shape read from config.json (shape.py), the tiny one built from a seed (tiny.py), its forward
for hidden states (forward.py), and verifiers as a user has them made into a local Hugging Face causal LM dir
(config.json, safetensors weights, the tokenizer with its chat template):

    eagle3 verifier from-gguf FILE OUT     # a GGUF file (llama.cpp's format) -> an fp32 safetensors dir
"""
