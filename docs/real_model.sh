#!/bin/bash
# docs/real_model.md's experiment: an EAGLE-3 drafter for SmolLM2-135M-Instruct trained on ShareGPT's own responses
# and on SmolLM2's regenerated ones, measured on held-out ShareGPT prompts (never trained on) in the harness
# (eval.accept) and in vLLM (eagle3.serve) at T=0 and T=0.7, beside vLLM without speculation.
#   bash docs/real_model.sh [OUT_DIR]            SEEDS="0 1 2" by default; SEEDS=0 for one seed per arm
set -euo pipefail
cd "$(dirname "$0")/.."
E=$(realpath -m "${1:-outputs/real_model}")
SEEDS=${SEEDS:-0 1 2}
mkdir -p "$E"
stamp() { echo "$(date -u +%FT%TZ) $*" | tee -a "$E/times.txt"; }

stamp "reference assets"
python -m eagle3.reference --install > "$E/reference.txt"      # SmolLM2 (from its GGUF) and ShareGPT, built once
SMOL=$(sed -n 1p "$E/reference.txt"); SHAREGPT=$(sed -n 2p "$E/reference.txt")
python -m eagle3.serve --install                                  # vLLM's own venv, built once

stamp "split"
# Training conversations from the head of the file, held-out prompts from its tail: none is trained on.
python - "$SHAREGPT" "$E" <<'PY'
import json, sys
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
text, records, at = open(sys.argv[1], encoding="utf-8").read(), [], 0
decoder = json.JSONDecoder()
at = text.index("[") + 1
while True:  # the wheel's file is cut mid-record: every complete record before the cut
    while at < len(text) and text[at] in " \n\r\t,":
        at += 1
    try:
        record, at = decoder.raw_decode(text, at)
    except json.JSONDecodeError:
        break
    records.append(record)

def messages(record, max_chars):
    turns = [{"role": ROLES.get(t.get("from")), "content": t.get("value") or ""} for t in record["conversations"]]
    if not turns or any(t["role"] is None or not t["content"].strip() for t in turns):
        return None
    while turns and turns[0]["role"] != "user":
        turns = turns[1:]
    if len(turns) < 2 or sum(len(t["content"]) for t in turns) > max_chars:
        return None
    return turns

def write(name, rows):
    with open(f"{sys.argv[2]}/{name}.jsonl", "w") as f:
        f.writelines(json.dumps({"messages": m}) + "\n" for m in rows)
    print(f"{name}: {len(rows)} conversations")

head, tail = records[:len(records) // 2], records[-2000:]
train = [m for m in (messages(r, 4000) for r in head) if m][:800]
write("train", train)                                                         # ShareGPT's own responses
write("regen_prompts", [m[:1] for m in train])                                # first user turns, to regenerate
write("held_out", [m[:1] for m in (messages(r, 2000) for r in tail) if m][:64])   # prompts never trained on
PY

ENGINE=vllm   # regeneration by vLLM (python -m eagle3.serve --install above); transformers works too, slower
REGEN="data.regenerate.engine=$ENGINE data.regenerate.temperature=0 data.regenerate.max_new_tokens=256"
for seed in $SEEDS; do
  stamp "train sharegpt_$seed"
  python launch.py experiment=smollm2_sharegpt data.path="$E/train.jsonl" seed=$seed logger.mode=disabled \
    hydra.run.dir="$E/sharegpt_$seed"
  stamp "train regen_$seed"
  python launch.py experiment=smollm2_sharegpt data=regenerate data.path="$E/regen_prompts.jsonl" $REGEN \
    seed=$seed logger.mode=disabled hydra.run.dir="$E/regen_$seed"
done

RUNS=$(for seed in $SEEDS; do echo "$E/sharegpt_$seed" "$E/regen_$seed"; done)
for t in 0 0.7; do
  for run in $RUNS; do
    stamp "harness $(basename "$run") T=$t"
    python -m eagle3.eval.accept --run "$run" --prompts "$E/held_out.jsonl" --num-prompts 32 --max-new-tokens 96 \
      --temperature $t --out "$run/accept_t$t.json"
  done
  stamp "vLLM T=$t"
  # One plain server for all runs; each run's report serve_vllm_k3_t<T>.json beside it. At T=0 in fp32 it exits 1
  # when the engine's tokens differ from the harness's; the reports are written first, so the table still reads them.
  python -m eagle3.serve $RUNS --prompts "$E/held_out.jsonl" --num-prompts 32 --max-new-tokens 96 \
    --temperature $t --k 3 || echo "eagle3.serve exited $? at T=$t (see its reports)" | tee -a "$E/times.txt"
done
stamp "done"

python - "$E" $RUNS <<'PY'
import glob, json, sys
from pathlib import Path
print(f"{'run':<12}{'T':>5}{'harness accept_len':>20}{'per position':>24}{'vLLM accept_len':>17}{'per position':>24}"
      f"{'tok/s spec':>12}{'tok/s plain':>13}{'speedup':>9}")
for t in ("0", "0.7"):
    for run in map(Path, sys.argv[2:]):
        h = json.loads((run / f"accept_t{t}.json").read_text())
        served = [json.loads(Path(p).read_text()) for p in sorted(glob.glob(str(run / f"serve_vllm_k3_t{t}*.json")))]
        v = served[0] if served else None
        rates = str([round(a / v["drafts"], 3) for a in v["accepted_per_position"]]) if v else "-"
        cells = (f"{v['accept_len']:>17.4f}{rates:>24}{v['tokens_per_s']:>12.1f}{v['plain_tokens_per_s']:>13.1f}"
                 f"{v['speedup']:>9.3f}" if v else f"{'-':>17}{'-':>24}{'-':>12}{'-':>13}{'-':>9}")
        print(f"{run.name:<12}{t:>5}{h['accept_len']:>20.4f}{str([round(r, 3) for r in h['accept_rate']]):>24}{cells}")
PY
