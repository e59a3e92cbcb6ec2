#!/usr/bin/env bash
# A checkpoint taken in the middle of an epoch resumes at another world size: a 2-rank
# train_digits run, killed by a crash fault at step 40 (mid-epoch 2; its last
# checkpoint is step 35), is resumed on 4 ranks with --sharding fsdp, on 3 ranks (the
# global batch of 64 in uneven shares, 22/21/21, gradients weighted by share) and, separately,
# in one process. Each resumed run re-splits the rest of epoch 2 over its ranks
# (DistributedSampler: every sample not yet seen is seen once) and ends after the same
# 69 steps as the uninterrupted 2-rank run -- the global batch is the same, so the step
# count is -- with the same test accuracy to within a point. (Not bit for bit: the sum
# over ranks is taken in another order, and epoch 3 pads 4 ranks differently.)
#
#   resume_world_size_test.sh TRAIN_DIGITS
set -euo pipefail
train=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--epochs 3 --save-every 7)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() { local np=$1; shift; mpirun -np "$np" --oversubscribe --bind-to none "$train" "${common[@]}" "$@"; }
accuracy() { grep -o 'final test accuracy [0-9.]*' "$1" | awk '{print $4}'; }

echo "== reference: 2 ranks, no failure"
run 2 --checkpoint-dir "$work/ref" > "$work/ref.log" 2>&1 || { cat "$work/ref.log"; exit 1; }
grep -q '(69 steps, 2 rank(s))' "$work/ref.log" || { cat "$work/ref.log"; exit 1; }

for target in "4 --sharding fsdp" "3" "1"; do
  set -- $target
  np=$1; shift
  dir="$work/np$np"
  echo "== 2 ranks crash at step 40, resumed on $np rank(s) $*"
  if TROUPE_FAULT_ARMED=1 TROUPE_FAULT=rank=1,step=40,kind=crash run 2 --checkpoint-dir "$dir" > "$dir.crash.log" 2>&1; then
    cat "$dir.crash.log"; echo "FAIL: the fault did not end the 2-rank run"; exit 1
  fi
  run "$np" --checkpoint-dir "$dir" "$@" > "$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
  grep -E 'resumed|epoch   [23]/3|final|hash' "$dir.log"
  grep -q 'resumed from .* at step 35 (epoch 2, in progress)' "$dir.log" \
    || { cat "$dir.log"; echo "FAIL: did not resume mid-epoch 2 from step 35"; exit 1; }
  grep -q "(69 steps, $np rank(s))" "$dir.log" || { cat "$dir.log"; echo "FAIL: not 69 steps in all"; exit 1; }
  awk -v a="$(accuracy "$dir.log")" -v b="$(accuracy "$work/ref.log")" \
    'BEGIN { d = a - b; if (d < 0) d = -d; if (d > 0.01) { print "FAIL: accuracy " a " vs " b; exit 1 } }'
done
echo "PASS"
