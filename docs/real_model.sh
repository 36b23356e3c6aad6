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
# Slices of the ShareGPT file in its own format (a JSON array of {"id", "conversations"} records), read with the
# project's reader: training conversations from the head of the file, held-out prompts from its tail, never trained
# on. (The bare `python launch.py experiment=smollm2_sharegpt` trains on the file's first 200 records: also head.)
python - "$SHAREGPT" "$E" <<'PY'
import json, sys
from pathlib import Path
from eagle3.formats.row_formats import SHAREGPT_ROLES
from eagle3.formats.row_files import records
# every complete record: the wheel's file is cut mid-record, and the cut is the one unreadable record after them
rows = [r for _, r in records(Path(sys.argv[1])) if isinstance(r, dict)]

def exchange(record, max_chars):
    """The record from its first human turn on, if every turn is a known speaker's with text and it is short."""
    turns = record.get("conversations") or []
    if not turns or any(t.get("from") not in SHAREGPT_ROLES or not (t.get("value") or "").strip() for t in turns):
        return None
    while turns and SHAREGPT_ROLES[turns[0]["from"]] != "user":
        turns = turns[1:]
    if len(turns) < 2 or sum(len(t["value"]) for t in turns) > max_chars:
        return None
    return {"id": record.get("id"), "conversations": turns}

def write(name, records):
    Path(f"{sys.argv[2]}/{name}.json").write_text(json.dumps(records, indent=1))
    print(f"{name}: {len(records)} conversations")

head, tail = rows[:len(rows) // 2], rows[-2000:]
train = [r for r in (exchange(r, 4000) for r in head) if r][:800]
first_turn = lambda r: {**r, "conversations": r["conversations"][:1]}
write("train", train)                                                          # ShareGPT's own responses
write("regen_prompts", [first_turn(r) for r in train])                         # first user turns, to regenerate
write("held_out", [first_turn(r) for r in (exchange(r, 2000) for r in tail) if r][:64])  # never trained on
PY

ENGINE=vllm   # regeneration by vLLM (python -m eagle3.serve --install above); transformers works too, slower
REGEN="data.regenerate.engine=$ENGINE data.regenerate.temperature=0 data.regenerate.max_new_tokens=256"
for seed in $SEEDS; do
  stamp "train sharegpt_$seed"
  # data.max_records=null: the slice is the selection (the experiment's default reads the file's first 200 records)
  python launch.py experiment=smollm2_sharegpt data.path="$E/train.json" data.max_records=null seed=$seed \
    logger.mode=disabled hydra.run.dir="$E/sharegpt_$seed"
  stamp "train regen_$seed"
  python launch.py experiment=smollm2_sharegpt data=regenerate data.path="$E/regen_prompts.json" \
    data.max_records=null $REGEN seed=$seed logger.mode=disabled hydra.run.dir="$E/regen_$seed"
done

RUNS=$(for seed in $SEEDS; do echo "$E/sharegpt_$seed" "$E/regen_$seed"; done)
for t in 0 0.7; do
  for run in $RUNS; do
    stamp "harness $(basename "$run") T=$t"
    python -m eagle3.eval.accept --run "$run" --prompts "$E/held_out.json" --num-prompts 32 --max-new-tokens 96 \
      --temperature $t --out "$run/accept_t$t.json"
  done
  stamp "vLLM T=$t"
  # One plain server for all runs; each run's report serve_vllm_k3_t<T>.json beside it. At T=0 in fp32 it exits 1
  # when the engine's tokens differ from the harness's; the reports are written first, so the table still reads them.
  python -m eagle3.serve $RUNS --prompts "$E/held_out.json" --num-prompts 32 --max-new-tokens 96 \
    --temperature $t --k 3 || echo "eagle3.serve exited $? at T=$t (see its reports)" | tee -a "$E/times.txt"
done
# N-GRAM BASELINE (pending): vLLM's n-gram (prompt lookup) speculation of the same verifier on the same held-out
# prompts, k and T, once eagle3.serve serves it; its report's keys are not final, so it is not run here yet.
stamp "done"

python - "$E" $RUNS <<'PY'
import json, sys
from pathlib import Path
print(f"{'run':<12}{'T':>5}{'harness accept_len':>20}{'per position':>24}{'vLLM accept_len':>17}{'per position':>24}"
      f"{'tok/s spec':>12}{'tok/s plain':>13}{'speedup':>9}")
for t in ("0", "0.7"):
    for run in map(Path, sys.argv[2:]):
        h = json.loads((run / f"accept_t{t}.json").read_text())
        report = run / f"serve_vllm_k3_t{t}.json"   # exactly: a glob t0* would also take t0.7's
        v = json.loads(report.read_text()) if report.is_file() else None
        rates = str([round(a / v["drafts"], 3) for a in v["accepted_per_position"]]) if v else "-"
        cells = (f"{v['accept_len']:>17.4f}{rates:>24}{v['tokens_per_s']:>12.1f}{v['plain_tokens_per_s']:>13.1f}"
                 f"{v['speedup']:>9.3f}" if v else f"{'-':>17}{'-':>24}{'-':>12}{'-':>13}{'-':>9}")
        print(f"{run.name:<12}{t:>5}{h['accept_len']:>20.4f}{str([round(r, 3) for r in h['accept_rate']]):>24}{cells}")
    # N-GRAM BASELINE (pending): one row per T from the n-gram report, once eagle3.serve writes it (keys not final).
PY
