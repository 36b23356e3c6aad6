#!/bin/bash
# docs/on_policy.md's experiment: from one base checkpoint, plain training continued against on-policy training
# (train.on_policy, T=1, mix 0.5), and plain training continued for as many draft positions (forward and backward)
# as the on-policy arm trained, judged by measured acceptance at T=0 and T=1, 3 seeds each.
#   bash docs/on_policy_experiment.sh [OUT_DIR]        (a run already complete in OUT_DIR is kept, not run again)
set -euo pipefail
cd "$(dirname "$0")/.."
E=$(realpath -m "${1:-outputs/on_policy}")
mkdir -p "$E"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
SMALL="data.synth.num_samples=128 data.synth.response_len=48 data.total_seq_len=512"  # the tests' small data
[ -f "$E/base/summary.json" ] || eagle3 train $SMALL optim.epochs=4 logger.mode=disabled hydra.run.dir="$E/base"
ONPOL="train.on_policy.enabled=true train.on_policy.temperature=1.0 train.on_policy.mix=0.5"
for seed in 0 1 2; do
  COMMON="$SMALL init=pretrained init.path=$E/base/checkpoints/best optim.lr=3e-4 seed=$seed logger.mode=disabled"
  [ -f "$E/plain$seed/summary.json" ] || eagle3 train $COMMON optim.epochs=2 hydra.run.dir="$E/plain$seed"
  # The on-policy arm, with its rollout loss wrapped to record the draft positions each rollout step trains: step 0
  # over every prefix position of a row, steps 1..k-1 at each of its verify rounds (eagle3/decoding/rollout.py)
  if [ ! -f "$E/onpol$seed/summary.json" ]; then
    rm -f "$E/onpol$seed/rollout_positions.jsonl"
    python - "$E/onpol$seed/rollout_positions.jsonl" launch.py $COMMON optim.epochs=2 $ONPOL \
      hydra.run.dir="$E/onpol$seed" <<'PY'
import json, runpy, sys

import eagle3.train.on_policy

out, inner = sys.argv[1], eagle3.train.on_policy.rollout_loss


def counted(draft, rows, *args):
    rounds, k = sum(len(r.ends) for r in rows), len(rows[0].drafts[0])
    with open(out, "a") as f:
        positions = sum(len(r.ids) - 1 for r in rows) + (k - 1) * rounds
        f.write(json.dumps({"rounds": rounds, "draft_positions": positions}) + "\n")
    return inner(draft, rows, *args)


eagle3.train.on_policy.rollout_loss = counted
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
PY
  fi
  # Plain steps for the on-policy arm's draft positions: an offline step trains ttt_steps x its tokens
  STEPS=$(python - "$E/onpol$seed" <<'PY'
import json, sys
run = sys.argv[1]
summary = json.load(open(f"{run}/summary.json"))
offline = 3 * summary["tokens"] / summary["steps"]  # model.draft.ttt_steps=3
rollout = sum(json.loads(line)["draft_positions"] for line in open(f"{run}/rollout_positions.jsonl"))
print(round(summary["steps"] + rollout / offline))
PY
)
  [ -f "$E/plainmatched$seed/summary.json" ] || eagle3 train $COMMON optim.epochs=3 optim.max_steps=$STEPS \
    hydra.run.dir="$E/plainmatched$seed"
  for run in plain$seed onpol$seed plainmatched$seed; do
    for t in 0 1; do
      [ -f "$E/$run/acc_t$t.json" ] || eagle3 accept "$E/$run/checkpoints/last" --run "$E/$run" \
        --temperature $t --num-prompts 16 --max-new-tokens 48 --out "$E/$run/acc_t$t.json"
    done
  done
done
for t in 0 1; do
  [ -f "$E/base/acc_t$t.json" ] || eagle3 accept --run "$E/base" --temperature $t --num-prompts 16 \
    --max-new-tokens 48 --out "$E/base/acc_t$t.json"
done
python - "$E" <<'PY'
import json, statistics, sys
E = sys.argv[1]
for t in (0, 1):
    print(f"T={t} base accept_len {json.load(open(f'{E}/base/acc_t{t}.json'))['accept_len']:.4f}")
    for arm in ("plain", "onpol", "plainmatched"):
        lens = [json.load(open(f"{E}/{arm}{s}/acc_t{t}.json"))["accept_len"] for s in (0, 1, 2)]
        print(f"T={t} {arm:12} accept_len {' '.join(f'{x:.4f}' for x in lens)}  mean {statistics.mean(lens):.4f} "
              f"sd {statistics.stdev(lens):.4f}")
for s in (0, 1, 2):
    positions = {}
    for arm in ("plain", "onpol", "plainmatched"):
        summary = json.load(open(f"{E}/{arm}{s}/summary.json"))
        positions[arm] = 3 * summary["tokens"]
        if arm == "onpol":
            with open(f"{E}/onpol{s}/rollout_positions.jsonl") as f:
                positions[arm] += sum(json.loads(line)["draft_positions"] for line in f)
        positions[arm] = (summary["steps"], int(positions[arm]), round(summary["train_wall_s"], 1))
    print(f"seed {s} (steps, draft positions, train s): {positions}")
PY
