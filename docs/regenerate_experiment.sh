#!/bin/bash
# docs/regenerate.md's experiment: a draft trained on responses the verifier wrote against one trained on responses
# another model (the verifier's derived sibling) wrote to the same prompts, judged by measured acceptance at T=0 and
# T=1 on held-out prompts, 3 training seeds each.   bash docs/regenerate_experiment.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
E=$(realpath -m "${1:-outputs/regenerate}")
mkdir -p "$E"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
python - "$E" <<'PY'
import json, random, sys
# 512 train prompts and 32 held-out ones: 16 random token ids each, then one loss-mask-1 position marking the response
for name, seed, n in (("prompts", 0, 512), ("held_out", 1, 32)):
    rng = random.Random(seed)
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        for _ in range(n):
            f.write(json.dumps({"input_ids": [rng.randrange(1024) for _ in range(16)] + [0],
                                "loss_mask": [0] * 16 + [1]}) + "\n")
PY
# As the tiny default samples its responses: T=1, 112 tokens
REGEN="data.regenerate.temperature=1.0 data.regenerate.max_new_tokens=112 data.regenerate.batch_size=64"
SIBLING="model.verifier.tiny.perturb_std=0.5 model.verifier.tiny.token_shift=0.5"  # docs/k2_to_k25.md's "K2.5"
# The sibling writes the responses (optim.max_steps=0: no training); its data_check.json names the rows' dir
eagle3 train data=regenerate data.path="$E/prompts.jsonl" $REGEN $SIBLING optim.max_steps=0 \
  logger.mode=disabled hydra.run.dir="$E/sibling_rows"
OTHER=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['data_dir'])" "$E/sibling_rows/data_check.json")
for seed in 0 1 2; do
  eagle3 train data=regenerate data.path="$E/prompts.jsonl" $REGEN seed=$seed logger.mode=disabled \
    hydra.run.dir="$E/own_$seed"
  eagle3 train data=online data.path="$OTHER" seed=$seed logger.mode=disabled hydra.run.dir="$E/other_$seed"
done
for run in own_0 own_1 own_2 other_0 other_1 other_2; do
  for t in 0 1; do
    eagle3 accept --run "$E/$run" --prompts "$E/held_out.jsonl" --num-prompts 32 \
      --max-new-tokens 64 --temperature $t --out "$E/$run/accept_t$t.json"
  done
done
python - "$E" <<'PY'
import json, statistics, sys
for t in (0, 1):
    for arm in ("own", "other"):
        lens = [json.load(open(f"{sys.argv[1]}/{arm}_{s}/accept_t{t}.json"))["accept_len"] for s in (0, 1, 2)]
        print(f"T={t} {arm:6} accept_len {' '.join(f'{x:.4f}' for x in lens)}  mean {statistics.mean(lens):.4f} "
              f"sd {statistics.stdev(lens):.4f}")
PY
