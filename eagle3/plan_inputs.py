"""What the plan (eagle3/plan.py) needs from the machine and the disk: the device and its memory, the dataset's
token counts and hidden-state bytes, and the verifier's size when the training process loads it.

Reads only headers and sizes: no weights, no hidden states. torch is imported only to ask a visible GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

from eagle3.config import DataConfig, VerifierConfig
from eagle3.plan import DTYPE_BYTES, DataStats

GB = 1e9  # distributed.device_memory_gb is in GB (10^9 bytes), as GPU datasheets state it (H200: 141 GB)


def device_and_memory(device: str, device_memory_gb: float | None,
                      in_process: bool = True) -> tuple[str, int | None, str]:
    """(device type the run will use, bytes of memory per device to check against, where that number came from).
    `in_process`: the rank runs in this process (one rank in all), so asking the GPU's free memory costs no
    extra CUDA context; otherwise the ranks' own processes hold the GPUs and this one reads only the
    device's total (no context is created for it)."""
    if device_memory_gb is not None:
        kind = "cpu" if device == "cpu" else "cuda"
        return kind, int(device_memory_gb * GB), f"distributed.device_memory_gb={device_memory_gb:g}"
    if device == "cpu":
        return "cpu", None, "no device memory to check against (device=cpu; set distributed.device_memory_gb)"
    import torch

    if torch.cuda.is_available():
        if not in_process:
            props = torch.cuda.get_device_properties(0)
            return "cuda", int(props.total_memory), f"total of {props.name} (device properties)"
        free, total = torch.cuda.mem_get_info()
        return "cuda", int(free), f"free on {torch.cuda.get_device_name()} of {total / GB:.0f} GB (mem_get_info)"
    return ("cuda" if device == "cuda" else "cpu", None,
            "no device memory to check against (no GPU visible, distributed.device_memory_gb not set)")


def dataset_stats(data: DataConfig, hidden_size: int, aux_layer_ids: list[int]) -> DataStats | None:
    """Token counts of the train split and the hidden-state bytes on disk; None when there are no rows yet.
    Synthetic data: from its config (num_samples x (prompt + response) tokens), nothing read."""
    if data.path is None:
        synth = data.synth
        assert synth is not None  # DataConfig.check: exactly one of path and synth
        seq = synth.prompt_len + synth.response_len
        train_rows = int(synth.num_samples * data.train_ratio)
        per_token = (len(aux_layer_ids) + 1) * hidden_size * DTYPE_BYTES.get(data.hidden_states_dtype, 2)
        return DataStats(train_tokens=train_rows * seq, train_rows=train_rows, total_tokens=synth.num_samples * seq,
                         hidden_bytes_on_disk=synth.num_samples * seq * per_token)  # what synthesis writes
    path = Path(data.path)
    if not any(path.glob("*.arrow")):
        return None
    from eagle3.data.rows import ArrowRows

    try:
        lengths = ArrowRows(path).seq_len
    except Exception:  # noqa: BLE001  (the start-up data check reports a broken dataset with its own message)
        return None
    split = int(len(lengths) * data.train_ratio)
    hidden = sum(f.stat().st_size for f in (path / "hidden_states").glob("*.safetensors"))
    return DataStats(train_tokens=int(lengths[:split].sum()), train_rows=split, total_tokens=int(lengths.sum()),
                     hidden_bytes_on_disk=hidden)


def verifier_size(verifier: VerifierConfig) -> tuple[int, str]:
    """Bytes of the verifier as loaded for measured acceptance: its safetensors files, else a Llama-shaped
    estimate from its config (fp32 for the tiny verifier, which is built in fp32)."""
    verifier_path, tiny = verifier.path, verifier.tiny
    if verifier_path is not None:
        files = list(Path(verifier_path).glob("*.safetensors"))
        if files:
            return sum(f.stat().st_size for f in files), f"its safetensors files in {verifier_path}"
        config = json.loads((Path(verifier_path) / "config.json").read_text())
        h, layers = config["hidden_size"], config["num_hidden_layers"]
        params = 2 * config["vocab_size"] * h + layers * (4 * h * h + 3 * h * config.get("intermediate_size", 4 * h))
        return 2 * params, "estimated from config.json as a dense model in bf16 (no weights present)"
    assert tiny is not None  # VerifierConfig.check: exactly one of path and tiny
    h = tiny.hidden_size
    params = 2 * tiny.vocab_size * h + tiny.num_layers * (4 * h * h + 3 * h * tiny.intermediate_size)
    return 4 * params, "the tiny verifier, fp32"
