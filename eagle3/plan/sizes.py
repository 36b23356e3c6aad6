"""What the plan (eagle3/plan/memory.py) needs from the machine and the disk: the device and its memory, the dataset's
token counts and hidden-state bytes, and the verifier's size when the training process loads it (its shape too
for data=online, which runs it in every rank), both counted from its config by verifier_shape when no weights are
there.

Reads only headers and sizes: no weights, no hidden states. torch is imported only to ask a visible GPU.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from eagle3.config import SynthConfig, VerifierConfig
from eagle3.errors import ConfigError
from eagle3.plan.parts import DataStats, VerifierShape
from eagle3.verifier.model import Verifier

GB = 1e9  # distributed.device_memory_gb is in GB (10^9 bytes), as GPU datasheets state it (H200: 141 GB)


def device_and_memory(device: str, device_memory_gb: float | None, in_process: bool = True,
                      ranks_per_node: int = 1) -> tuple[str, int | None, str]:
    """(device type the run will use, bytes of memory per device to check against, where that number came from).
    `in_process`: the rank runs in this process (one rank in all), so asking the GPU's free memory costs no
    extra CUDA context; otherwise the ranks' own processes hold the GPUs and this one reads only the
    device's total (no context is created for it). On CPU the device is the host: its available memory, shared
    by the `ranks_per_node` ranks this node starts."""
    if device_memory_gb is not None:
        kind = "cpu" if device == "cpu" else "cuda"
        return kind, int(device_memory_gb * GB), f"distributed.device_memory_gb={device_memory_gb:g}"
    if device == "cpu":
        return ("cpu", *host_memory(ranks_per_node))
    import torch

    if torch.cuda.is_available():
        if not in_process:
            props = torch.cuda.get_device_properties(0)
            return "cuda", int(props.total_memory), f"total of {props.name} (device properties)"
        free, total = torch.cuda.mem_get_info()
        return "cuda", int(free), f"free on {torch.cuda.get_device_name()} of {total / GB:.0f} GB (mem_get_info)"
    if device == "cuda":
        return "cuda", None, "no device memory to check against (no GPU visible, distributed.device_memory_gb not set)"
    return ("cpu", *host_memory(ranks_per_node))


def host_memory(ranks: int) -> tuple[int | None, str]:
    """Bytes of host memory per rank (the available memory, /proc/meminfo's MemAvailable, or the free physical
    pages where there is no /proc, over the node's ranks) and where that came from; None where neither is known."""
    try:
        line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemAvailable:"))
        available, source = int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except (OSError, StopIteration, ValueError, IndexError):
        try:
            available, source = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free physical pages"
        except (OSError, ValueError):
            return None, "no device memory to check against (host memory unknown; set distributed.device_memory_gb)"
    shared = f" shared by {ranks} ranks" if ranks > 1 else ""
    return available // ranks, f"host memory available, {available / GB:.1f} GB{shared} ({source}; device=cpu)"


def synth_stats(synth: SynthConfig, train_ratio: float, hidden_bytes_per_token: int) -> DataStats:
    """Sampled rows' token counts, from their config alone (num_samples x (prompt + response) tokens), and the
    hidden-state bytes they store on disk (`hidden_bytes_per_token`: 0 when they are computed in the loop)."""
    seq = synth.prompt_len + synth.response_len
    train_rows = int(synth.num_samples * train_ratio)
    return DataStats(train_tokens=train_rows * seq, train_rows=train_rows, total_tokens=synth.num_samples * seq,
                     hidden_bytes_on_disk=synth.num_samples * seq * hidden_bytes_per_token,
                     train_lengths=[seq] * train_rows)


def arrow_stats(path: Path, train_ratio: float, hidden_files: bool) -> DataStats | None:
    """Token counts of a dataset dir's train split, and with `hidden_files` the bytes of its hidden-state files;
    None when the dir holds no rows yet (or cannot be read: the start-up data check says why)."""
    if not path.is_dir() or not any(path.glob("*.arrow")):
        return None
    from eagle3.formats.arrow_rows import ArrowRows

    try:
        lengths = ArrowRows(path).seq_len
    except Exception:  # noqa: BLE001  (the start-up data check reports a broken dataset with its own message)
        return None
    split = int(len(lengths) * train_ratio)
    hidden = sum(f.stat().st_size for f in (path / "hidden_states").glob("*.safetensors")) if hidden_files else 0
    return DataStats(train_tokens=int(lengths[:split].sum()), train_rows=split, total_tokens=int(lengths.sum()),
                     hidden_bytes_on_disk=hidden, train_lengths=lengths[:split].tolist())


def verifier_size(verifier: VerifierConfig) -> tuple[int, str]:
    """Bytes of the verifier as loaded for measured acceptance: its safetensors files, else its parameters as
    verifier_shape counts them from its config (a mixture of experts with all its experts) in bf16, or in fp32
    for the tiny verifier, which is built in fp32."""
    if verifier.path is None:
        return 4 * verifier_shape(verifier).params, "the tiny verifier, fp32"
    files = list(Path(verifier.path).glob("*.safetensors"))
    if files:
        return sum(f.stat().st_size for f in files), f"its safetensors files in {verifier.path}"
    return 2 * verifier_shape(verifier).params, "estimated from config.json in bf16 (no weights present)"


def verifier_shape(verifier: VerifierConfig) -> VerifierShape:
    """The shape data=online's plan needs (eagle3.plan.memory.VerifierShape): parameter counts from config.json (a
    Llama-style decoder with grouped-query attention, or DeepSeek-V3's latent attention and mixture of experts), the
    total from the safetensors headers when the weights are there and unquantized; the tiny verifier from its config."""
    if verifier.path is None:
        tiny = verifier.tiny
        assert tiny is not None  # VerifierConfig.check: exactly one of path and tiny
        config: dict[str, Any] = {"hidden_size": tiny.hidden_size, "num_hidden_layers": tiny.num_layers,
                                  "num_attention_heads": tiny.num_heads, "num_key_value_heads": tiny.num_heads,
                                  "intermediate_size": tiny.intermediate_size, "vocab_size": tiny.vocab_size,
                                  "tie_word_embeddings": False}
        return shape_from_config(config, "the tiny verifier's config")
    given = Verifier(verifier.path)
    config = given.config  # a multimodal wrapper's (Kimi-K2.5) text_config: the decoder's
    try:
        shape = shape_from_config(config, f"estimated from {verifier.path}/config.json")
    except KeyError as e:
        raise ConfigError(f"model.verifier.path: {verifier.path}/config.json has no {e}, which the plan needs to size "
                          f"the verifier (a Llama- or DeepSeek-V3-style decoder config has it)") from None
    counted = safetensors_params(Path(verifier.path)) if not given.quantized else None
    if counted:
        shape.params, shape.source = counted, f"the safetensors headers in {verifier.path} (shape from config.json)"
    elif given.quantized:
        shape.source += " (its checkpoint is quantized; online loads it at 2 bytes per parameter on CUDA)"
    return shape


def shape_from_config(config: dict[str, Any], source: str) -> VerifierShape:
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads = config["num_attention_heads"]
    if "kv_lora_rank" in config:  # multi-head latent attention (DeepSeek-V3, Kimi-K2): low-rank q and kv
        nope, rope, v_dim = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
        q_rank, kv_rank = config.get("q_lora_rank"), config["kv_lora_rank"]
        q_dim, kv_dim = heads * (nope + rope), heads * (nope + rope + v_dim)
        q_proj = h * q_rank + q_rank + q_rank * q_dim if q_rank else h * q_dim
        attention = q_proj + h * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v_dim) + heads * v_dim * h
    else:
        head_dim = config.get("head_dim") or h // heads
        q_dim, kv_dim = heads * head_dim, 2 * config.get("num_key_value_heads", heads) * head_dim
        attention = h * q_dim + h * kv_dim + q_dim * h
    dense_width = config.get("intermediate_size", 4 * h)
    experts = config.get("n_routed_experts") or config.get("num_experts") or config.get("num_local_experts") or 0
    dense_layers = min(layers, config.get("first_k_dense_replace", 0)) if experts else layers
    expert_width = config.get("moe_intermediate_size", dense_width)
    shared, top_k = config.get("n_shared_experts") or 0, config.get("num_experts_per_tok", 1)
    dense_layer = attention + 3 * h * dense_width + 2 * h
    moe_layer = attention + (experts + shared) * 3 * h * expert_width + h * experts + 2 * h
    embedding = vocab * h + h  # embed_tokens and the final norm
    lm_head = 0 if config.get("tie_word_embeddings", False) else vocab * h
    moe_layers = layers - dense_layers
    params = embedding + lm_head + dense_layers * dense_layer + moe_layers * moe_layer
    moe_active = attention + (shared + top_k) * 3 * h * expert_width
    active = dense_layers * (attention + 3 * h * dense_width) + moe_layers * moe_active
    mlp_width = max(dense_width if dense_layers else 0, (shared + top_k) * expert_width if moe_layers else 0)
    return VerifierShape(params=params, embedding=embedding, lm_head=lm_head,
                         layer_params=moe_layer if moe_layers else dense_layer, active_params=active,
                         num_layers=layers, hidden_size=h, q_dim=q_dim, kv_dim=kv_dim, mlp_width=mlp_width,
                         source=source)


def safetensors_params(model_dir: Path) -> int:
    """Elements of every tensor in the dir's safetensors files, from their headers alone (0 without files)."""
    from eagle3.formats.tensorfile import HeaderError, read_specs

    total = 0
    for file in sorted(model_dir.glob("*.safetensors")):
        try:
            fd = os.open(file, os.O_RDONLY)
        except OSError:  # unreadable: the config's estimate stands; loading will say why
            return 0
        try:
            specs = read_specs(fd)
        except HeaderError:
            return 0
        finally:
            os.close(fd)
        total += sum(math.prod(spec.shape) for spec in specs.values())
    return total
