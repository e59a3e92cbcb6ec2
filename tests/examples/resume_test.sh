#!/usr/bin/env bash
# The guarantee end to end, on 2 ranks: train_digits under troupe-run, rank 1 killed
# (kill -9 equivalent: a crash fault) in the middle of an epoch, relaunched, resumed
# from its last mid-epoch checkpoint -- ends bit for bit where a run that never failed
# ends: the same parameter hash, and `troupe-ckpt diff` of the two final checkpoints
# says identical (model and optimizer state). The same after rank 0 is killed in the
# middle of writing a checkpoint (the resume uses the one before), after a hang of
# rank 0 and after an exception on rank 1. Then a
# plain restart with the same folder resumes by itself (no troupe-run), and a fault on
# every launch gives up.
#
#   resume_test.sh TROUPE_RUN TRAIN_DIGITS TROUPE_CKPT [extra troupe-run flags...]
set -euo pipefail
troupe_run=$1 train=$2 ckpt=$3
shift 3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--epochs 3 --save-every 7)

echo "== reference: no failure"
"$troupe_run" -np 2 --checkpoint-dir "$work/ref" --backoff 0 "$@" -- "$train" "${common[@]}" > "$work/ref.log" 2>&1 \
  || { cat "$work/ref.log"; exit 1; }
ref_hash=$(grep -o 'parameters hash [0-9a-f]*' "$work/ref.log")

echo "== crash of rank 1 at step 40 (mid-epoch 2), first launch only"
TROUPE_FAULT_ARMED=1 TROUPE_FAULT=rank=1,step=40,kind=crash,restart=0 \
  "$troupe_run" -np 2 --max-restarts 2 --checkpoint-dir "$work/crash" --backoff 0 "$@" -- "$train" "${common[@]}" \
  > "$work/crash.log" 2>&1 || { cat "$work/crash.log"; exit 1; }
cat "$work/crash.log" | grep -E 'failure|resumed|hash|summary'
# The save of step 35 is written in the background; if rank 1 dies before it is durable,
# the resume rightly uses step 28's. Either is a mid-epoch checkpoint.
grep -Eq 'resumed from .* at step (28|35) \(epoch 2, in progress\)' "$work/crash.log" \
  || { echo "FAIL: did not resume from a mid-epoch checkpoint of epoch 2"; exit 1; }
# The launch saved checkpoints before it failed: the backoff starts over.
grep -q '"event": "restart".*"failed_in_a_row": 1' "$work/crash/troupe-run-events.jsonl" \
  || { grep restart "$work/crash/troupe-run-events.jsonl"; echo "FAIL: the backoff did not start over"; exit 1; }
crash_hash=$(grep -o 'parameters hash [0-9a-f]*' "$work/crash.log")
[[ "$crash_hash" == "$ref_hash" ]] || { echo "FAIL: $crash_hash after the crash, $ref_hash without"; exit 1; }

last() { ls "$1"/ckpt-*.h5 | sort | tail -1; }
"$ckpt" diff "$(last "$work/ref")" "$(last "$work/crash")" || { echo "FAIL: final checkpoints differ"; exit 1; }

echo "== rank 0 (the writer) killed with SIGKILL while writing the checkpoint of step 42: resumes from 35, same result"
TROUPE_FAULT_ARMED=1 TROUPE_FAULT=rank=0,step=42,kind=crash_in_save,restart=0 \
  "$troupe_run" -np 2 --max-restarts 2 --checkpoint-dir "$work/torn" --backoff 0 "$@" -- "$train" "${common[@]}" \
  > "$work/torn.log" 2>&1 || { cat "$work/torn.log"; exit 1; }
grep -E 'fault|unfinished|failure|resumed|hash' "$work/torn.log"
grep -q 'troupe fault: crash_in_save on rank 0 at step 42' "$work/torn.log" \
  || { cat "$work/torn.log"; echo "FAIL: the fault did not fire"; exit 1; }
grep -q 'ignoring unfinished checkpoint .*/\.ckpt-000000042\.h5\.tmp-' "$work/torn.log" \
  || { cat "$work/torn.log"; echo "FAIL: the half-written checkpoint of step 42 was not left behind"; exit 1; }
grep -q 'resumed from .* at step 35 (epoch 2, in progress)' "$work/torn.log" \
  || { cat "$work/torn.log"; echo "FAIL: did not resume from the checkpoint before the torn one"; exit 1; }
torn_hash=$(grep -o 'parameters hash [0-9a-f]*' "$work/torn.log")
[[ "$torn_hash" == "$ref_hash" ]] || { echo "FAIL: $torn_hash after the torn save, $ref_hash without"; exit 1; }
ls -a "$work/torn" | grep -q '\.tmp-' && { echo "FAIL: debris left after the next save: $(ls -a "$work/torn")"; exit 1; }

echo "== rank 0 hangs at step 30 (inside the step's collectives for rank 1): detected, restarted, same result"
TROUPE_FAULT_ARMED=1 TROUPE_FAULT=rank=0,step=30,kind=hang,restart=0 \
  "$troupe_run" -np 2 --max-restarts 2 --hang-timeout 6 --checkpoint-dir "$work/hang" --backoff 0 "$@" -- \
  "$train" "${common[@]}" > "$work/hang.log" 2>&1 || { cat "$work/hang.log"; exit 1; }
grep -E 'failure|resumed|hash' "$work/hang.log"
grep -q "failure (hang).*rank 0 at step 30" "$work/hang.log" || { cat "$work/hang.log"; echo "FAIL: the hang was not reported"; exit 1; }
hang_hash=$(grep -o 'parameters hash [0-9a-f]*' "$work/hang.log")
[[ "$hang_hash" == "$ref_hash" ]] || { echo "FAIL: $hang_hash after the hang, $ref_hash without"; exit 1; }

echo "== rank 1 throws at step 30: a lost rank quoting the error, seen at once (not a hang); same result"
TROUPE_FAULT_ARMED=1 TROUPE_FAULT=rank=1,step=30,kind=throw,restart=0 \
  "$troupe_run" -np 2 --max-restarts 2 --hang-timeout 60 --checkpoint-dir "$work/throw" --backoff 0 "$@" -- \
  "$train" "${common[@]}" > "$work/throw.log" 2>&1 || { cat "$work/throw.log"; exit 1; }
grep -E 'failure|resumed|hash' "$work/throw.log"
grep -q "failure (rank_lost): rank 1 .*failing with: injected fault (TROUPE_FAULT) on rank 1 at step 30" \
  "$work/throw.log" || { cat "$work/throw.log"; echo "FAIL: the exception was not reported as the cause"; exit 1; }
throw_hash=$(grep -o 'parameters hash [0-9a-f]*' "$work/throw.log")
[[ "$throw_hash" == "$ref_hash" ]] || { echo "FAIL: $throw_hash after the exception, $ref_hash without"; exit 1; }

echo "== started again with the same folder, without troupe-run: resumes, trains one more epoch"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun -np 2 --oversubscribe --bind-to none "$train" --epochs 4 --checkpoint-dir "$work/crash" > "$work/again.log" 2>&1 \
  || { cat "$work/again.log"; exit 1; }
grep -q 'resumed from .* at step 69 (epoch 3 done)' "$work/again.log" || { cat "$work/again.log"; exit 1; }
grep -q 'epoch   4/4' "$work/again.log" || { cat "$work/again.log"; exit 1; }

echo "== a crash on every launch: gives up after --max-restarts with status 1"
set +e
TROUPE_FAULT_ARMED=1 TROUPE_FAULT=rank=0,step=3,kind=crash \
  "$troupe_run" -np 2 --max-restarts 1 --checkpoint-dir "$work/doomed" --backoff 0 "$@" -- "$train" "${common[@]}" \
  > "$work/doomed.log" 2>&1
status=$?
set -e
[[ $status -eq 1 ]] || { cat "$work/doomed.log"; echo "FAIL: exit status $status, want 1"; exit 1; }
echo "PASS: resumed bit for bit ($ref_hash)"
