#!/bin/bash
# docs/real_model.md's learning curve: SmolLM2-135M-Instruct's EAGLE-3 drafter trained on up to ~1M tokens of
# unique ShareGPT conversations (hidden states from vLLM, stored once; training over them, 768-token steps),
# measured in vLLM at token budgets of ~50k, 100k, 200k, 500k and 1M on the 32 held-out prompts x 32 tokens of
# docs/real_model.sh (k=3, T=0), beside vLLM's n-gram speculation and plain decoding.
#   bash docs/learning_curve.sh [OUT_DIR]        # about 1.5 hours of an idle 2-core CPU; resumable: run it again
# Every stage is skipped when its output exists (the preparation and the training resume where they stopped), and
# its start and end go to OUT_DIR/times.txt. Knobs (environment):
#   CONVERSATIONS=2000   training conversations from the head half of ShareGPT (~1.07M tokens at 1,024 a row)
#   SEEDS="0"            training seeds; each is one run (the curve's points are checkpoints of it)
#   LR=5e-4  VOCAB=8192  SEQ=768     the recipe (experiment=smollm2_sharegpt's): tokens a step (rows longer are cut)
#   MAX_LEN=$((SEQ+1))   tokens a conversation keeps (prepare --max-len): a row of n tokens fills n - 1 positions
#   BUDGETS="50000 100000 200000 500000 1000000"   tokens at which a checkpoint is measured (the nearest kept one)
#   NUM_PROMPTS=32 MAX_NEW_TOKENS=32                held-out prompts measured, tokens generated per prompt
#   STEPS=1396           optim.max_steps of each run (at most two epochs): ~1.04M tokens, one epoch (1,303
#                        steps, 974k tokens at SEQ=768) and 7% of a second; empty: one epoch
#   CURVE_PNG=docs/learning_curve.png CURVE_CSV=docs/learning_curve.csv   where the curve's picture and CSV go
#   EAGLE3_VLLM_PYTHON   an interpreter that has vLLM, used instead of building the engine's venv
set -euo pipefail
cd "$(dirname "$0")/.."
E=$(realpath -m "${1:-outputs/learning_curve}")
CONVERSATIONS=${CONVERSATIONS:-2000}
SEEDS=${SEEDS:-0}
LR=${LR:-5e-4}; VOCAB=${VOCAB:-8192}; SEQ=${SEQ:-768}; MAX_LEN=${MAX_LEN:-$((SEQ + 1))}
BUDGETS=${BUDGETS:-50000 100000 200000 500000 1000000}
NUM_PROMPTS=${NUM_PROMPTS:-32}; MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-32}
STEPS=${STEPS-1396}
CURVE_PNG=${CURVE_PNG:-docs/learning_curve.png}; CURVE_CSV=${CURVE_CSV:-docs/learning_curve.csv}
mkdir -p "$E"
stamp() { echo "$(date -u +%FT%TZ) $*" | tee -a "$E/times.txt"; }
stamp "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

stamp "assets"
[ -s "$E/reference.txt" ] || eagle3 reference --install > "$E/reference.txt"
SMOL=$(sed -n 1p "$E/reference.txt"); SHAREGPT=$(sed -n 2p "$E/reference.txt")
[ -n "${EAGLE3_VLLM_PYTHON:-}" ] || eagle3 serve --install > /dev/null

if [ ! -s "$E/held_out.json" ]; then
  stamp "split"
  # docs/real_model.sh's split: training conversations from the head half of the file (<= 4,000 characters, from
  # their first human turn), held-out prompts (first human turns) from its last 2,000 records, never trained on.
  python docs/sharegpt_split.py "$SHAREGPT" "$E" --train "$CONVERSATIONS"
fi

stamp "hidden states (vLLM)"
eagle3 prepare --model "$SMOL" --data "$E/train.json" --out "$E/data" --engine vllm \
  --max-len "$MAX_LEN" --on-bad-sample skip --dtype float32
stamp "hidden states done"

# Each run keeps a copy of checkpoints/last at every checkpoint_every save (about 19k tokens apart) in
# snapshots/, so that the curve's points are checkpoints of one run (copied whole, never through a link).
snapshots() {
  local run=$1 last=""
  while true; do
    if [ -d "$run/checkpoints/last" ]; then
      local id; id=$(stat -c %i:%Y "$run/checkpoints/last" 2>/dev/null || true)
      if [ -n "$id" ] && [ "$id" != "$last" ]; then
        sleep 2
        python bench/learning_curve.py snapshot "$run" > /dev/null
        last=$id
      fi
    fi
    sleep 5
  done
}
TRAIN="model=auto model.verifier.path=$SMOL model.draft.draft_vocab_size=$VOCAB data=offline data.path=$E/data"
TRAIN="$TRAIN data.total_seq_len=$SEQ data.train_ratio=0.99 init=scratch optim=adamw optim.lr=$LR"
TRAIN="$TRAIN optim.warmup_ratio=0.03 optim.eval_every=50 optim.checkpoint_every=25 logger.mode=disabled"
[ -z "$STEPS" ] || TRAIN="$TRAIN optim.epochs=2 optim.max_steps=$STEPS"   # steps past one epoch go on into a second
for seed in $SEEDS; do
  run="$E/seed_$seed"
  [ -f "$run/summary.json" ] && continue
  stamp "train seed $seed"
  snapshots "$run" & watcher=$!
  if [ -f "$run/checkpoints/last/trainer_state.pt" ]; then eagle3 train resume="$run"
  else eagle3 train $TRAIN seed=$seed hydra.run.dir="$run"; fi
  kill $watcher 2>/dev/null || true
  python bench/learning_curve.py snapshot "$run" --name ck_final > /dev/null   # the end (kept when there)
  stamp "trained seed $seed"
done

stamp "points"
# One run dir per budget and seed (the run's records, the snapshot nearest the budget as checkpoints/best): what
# eagle3.serve measures.
python bench/learning_curve.py points "$E" --budgets $BUDGETS
stamp "vLLM k=3 T=0: every point beside plain, the first beside n-gram"
SERVE="--prompts $E/held_out.json --num-prompts $NUM_PROMPTS --max-new-tokens $MAX_NEW_TOKENS --k 3 --temperature 0"
mapfile -t POINTS < <(python bench/learning_curve.py unmeasured "$E")
if [ "${#POINTS[@]}" -gt 0 ]; then
  eagle3 serve "${POINTS[0]}" $SERVE || stamp "eagle3 serve exited $? (see its reports)"
  [ "${#POINTS[@]}" -gt 1 ] && { eagle3 serve "${POINTS[@]:1}" $SERVE --no-ngram \
    || stamp "eagle3 serve exited $? (see its reports)"; }
fi
stamp "curve"
python bench/learning_curve.py report "$E" --png "$CURVE_PNG" --csv "$CURVE_CSV"
stamp "done"
