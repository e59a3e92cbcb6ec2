#!/usr/bin/env bash
# Timelines end to end (docs/OBSERVABILITY.md, "Timelines"): train_digits at 2 ranks
# with a checkpoint in the window, train_gpt at 4 ranks as 2 pipelines of 2 stages,
# troupe-run --trace passing the folder to its ranks, the PNG drawn from a trace, and
# bad windows refused. check_trace.py reads each trace.json.
#
#   trace_test.sh TRAIN_DIGITS TRAIN_GPT TROUPE_RUN SOURCE_DIR
set -euo pipefail
digits=$1 gpt=$2 run=$3 src=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
check="/usr/bin/python3 $src/tests/examples/check_trace.py"
mpi="timeout 120 mpirun --oversubscribe --bind-to none"

# DDP: every step has its data, forward, backward (the buckets' all-reduces beside it)
# and optimizer; step 4 a checkpoint snapshot, written on the writer's thread.
$mpi -np 2 "$digits" --epochs 1 --checkpoint-dir "$tmp/ck" --save-every 4 --trace "$tmp/digits" \
  --trace-steps 3-5 > "$tmp/digits.log" 2>&1 || { cat "$tmp/digits.log"; fail "train_digits --trace"; }
grep -q "trace of steps 3-5: $tmp/digits/trace.json" "$tmp/digits.log" || fail "no trace line in the log"
$check "$tmp/digits/trace.json" --ranks 2 --steps 3-5 --expect data,forward,backward,optimizer \
  --per-step forward=1,backward=1 --track "world collectives"
grep -q '"name":"checkpoint snapshot"' "$tmp/digits/trace.json" || fail "no checkpoint snapshot span"

# Pipelines: each stage runs 4 micro-batches forward and backward per step; the
# activations travel on their own row.
$mpi -np 4 "$gpt" --preset quick --steps 4 --warmup-steps 1 --eval-every 100 --sample-chars 0 --pp 2 \
  --micro-batches 4 --trace "$tmp/gpt" --trace-steps 2-3 --metrics "$tmp/gpt.jsonl" > "$tmp/gpt.log" 2>&1 \
  || { cat "$tmp/gpt.log"; fail "train_gpt --pp 2 --trace"; }
$check "$tmp/gpt/trace.json" --ranks 4 --steps 2-3 --expect data,forward,backward,optimizer \
  --per-step forward=4,backward=4 --track "pp activations" --track "pp gradients"
# The stages' waits for each other count as communication in the time shares (they are
# on the pipeline's own communicators, not the world's).
/usr/bin/python3 -c '
import json, sys
last = [json.loads(line) for line in open(sys.argv[1])][-1]
share = last["comm_wait_share"]
assert share > 0.02, f"comm_wait_share {share} with a pipeline bubble"
print(f"comm_wait_share {share:.3f}")' "$tmp/gpt.jsonl" || fail "the pipeline waits are not in comm_wait_share"

# A picture of it (python3-matplotlib).
/usr/bin/python3 "$src/tools/plot_timeline.py" "$tmp/gpt/trace.json" -o "$tmp/gpt.png" --steps 3
[ -s "$tmp/gpt.png" ] || fail "plot_timeline.py drew nothing"

# troupe-run --trace: the ranks get the folder and the window through the environment.
timeout 120 "$run" -np 2 --trace "$tmp/run" --trace-steps 2 -- "$digits" --epochs 1 > "$tmp/run.log" 2>&1 \
  || { cat "$tmp/run.log"; fail "troupe-run --trace"; }
$check "$tmp/run/trace.json" --ranks 2 --steps 2-2 --expect forward,backward

# Bad windows are refused before training starts.
out=$("$digits" --trace "$tmp/bad" --trace-steps 5-3 2>&1) && fail "--trace-steps 5-3 accepted"
grep -q "must name steps FIRST <= LAST" <<< "$out" || fail "no clear error for 5-3: $out"
out=$("$run" -np 1 --trace-steps x -- "$digits" 2>&1) && fail "troupe-run --trace-steps x accepted"
grep -q "expected FIRST-LAST or STEP" <<< "$out" || fail "no clear error from troupe-run: $out"
echo PASS
