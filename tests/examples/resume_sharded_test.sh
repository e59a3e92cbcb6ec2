#!/usr/bin/env bash
# The resume guarantee in the sharded modes, on 2 ranks: train_digits --sharding fsdp
# under troupe-run, rank 1 killed (a crash fault, as kill -9) in the middle of epoch 2,
# relaunched and resumed from its last mid-epoch checkpoint, ends bit for bit where an
# uninterrupted fsdp run ends (parameter hash, and `troupe-ckpt diff` of the two final
# checkpoints). Then checkpoints cross modes and world sizes at an epoch's end, as the
# files are the same in every mode: a 2-rank ddp run's checkpoint resumes with
# --sharding fsdp on 4 ranks and trains on; the 2-rank fsdp run's resumes with
# --sharding zero1 in one process (continuing exactly as ddp there) and with
# --sharding zero2 on 2 ranks (ending where fsdp continuing ends). A rank killed in the
# middle of fsdp's parallel save (crash_in_save) resumes from the checkpoint before.
#
#   resume_sharded_test.sh TROUPE_RUN TRAIN_DIGITS TROUPE_CKPT
set -euo pipefail
troupe_run=$1 train=$2 ckpt=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--epochs 3 --save-every 7)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun -np 2 --oversubscribe --bind-to none)
last() { ls "$1"/ckpt-*.h5 | sort | tail -1; }
hash_of() { grep -o 'parameters hash [0-9a-f]*' "$1"; }

echo "== fsdp reference: no failure"
"$troupe_run" -np 2 --checkpoint-dir "$work/ref" --backoff 0 -- "$train" "${common[@]}" --sharding fsdp \
  > "$work/ref.log" 2>&1 || { cat "$work/ref.log"; exit 1; }
ref_hash=$(hash_of "$work/ref.log")

echo "== fsdp, crash of rank 1 at step 40 (mid-epoch 2), first launch only"
TROUPE_FAULT_ARMED=1 TROUPE_FAULT=rank=1,step=40,kind=crash,restart=0 \
  "$troupe_run" -np 2 --max-restarts 2 --checkpoint-dir "$work/crash" --backoff 0 -- "$train" "${common[@]}" \
  --sharding fsdp > "$work/crash.log" 2>&1 || { cat "$work/crash.log"; exit 1; }
grep -E 'failure|resumed|hash' "$work/crash.log"
grep -Eq 'resumed from .* at step (28|35) \(epoch 2, in progress\)' "$work/crash.log" \
  || { cat "$work/crash.log"; echo "FAIL: did not resume from a mid-epoch checkpoint of epoch 2"; exit 1; }
crash_hash=$(hash_of "$work/crash.log")
[[ "$crash_hash" == "$ref_hash" ]] || { echo "FAIL: $crash_hash after the crash, $ref_hash without"; exit 1; }
"$ckpt" diff "$(last "$work/ref")" "$(last "$work/crash")" || { echo "FAIL: final checkpoints differ"; exit 1; }

echo "== fsdp, rank 1 killed while the parallel save of step 42 is writing: resumes from 35, same result"
TROUPE_FAULT_ARMED=1 TROUPE_FAULT=rank=1,step=42,kind=crash_in_save,restart=0 \
  "$troupe_run" -np 2 --max-restarts 2 --checkpoint-dir "$work/torn" --backoff 0 -- "$train" "${common[@]}" \
  --sharding fsdp > "$work/torn.log" 2>&1 || { cat "$work/torn.log"; exit 1; }
grep -E 'fault|unfinished|resumed|hash' "$work/torn.log"
grep -q 'troupe fault: crash_in_save on rank 1 at step 42' "$work/torn.log" \
  || { cat "$work/torn.log"; echo "FAIL: the fault did not fire"; exit 1; }
grep -q 'resumed from .* at step 35 (epoch 2, in progress)' "$work/torn.log" \
  || { cat "$work/torn.log"; echo "FAIL: did not resume from the checkpoint before the torn one"; exit 1; }
[[ "$(hash_of "$work/torn.log")" == "$ref_hash" ]] || { echo "FAIL: $(hash_of "$work/torn.log") after the torn save"; exit 1; }
"$ckpt" diff "$(last "$work/ref")" "$(last "$work/torn")" || { echo "FAIL: final checkpoints differ"; exit 1; }

echo "== a ddp checkpoint of 2 ranks (epoch 2 done) resumed with --sharding fsdp on 4 ranks"
"${mpi[@]}" "$train" --epochs 2 --checkpoint-dir "$work/ddp" > "$work/ddp.log" 2>&1 || { cat "$work/ddp.log"; exit 1; }
mpirun -np 4 --oversubscribe --bind-to none "$train" --epochs 3 --checkpoint-dir "$work/ddp" --sharding fsdp \
  > "$work/ddp-fsdp.log" 2>&1 || { cat "$work/ddp-fsdp.log"; exit 1; }
grep -E 'resumed|epoch   3/3|hash' "$work/ddp-fsdp.log"
grep -q 'resumed from .* at step 46 (epoch 2 done)' "$work/ddp-fsdp.log" || { cat "$work/ddp-fsdp.log"; exit 1; }
grep -q 'epoch   3/3' "$work/ddp-fsdp.log" || { cat "$work/ddp-fsdp.log"; exit 1; }
grep -q 'parameters hash .* (69 steps, 4 rank(s))' "$work/ddp-fsdp.log" || { cat "$work/ddp-fsdp.log"; exit 1; }

echo "== the 2-rank fsdp run's checkpoint (epoch 3 done) resumed with --sharding zero1 in one process"
resume_from_fsdp() {  # folder, ranks, mode
  cp -r "$work/crash" "$work/$1"
  mpirun -np "$2" --oversubscribe --bind-to none "$train" --epochs 4 --checkpoint-dir "$work/$1" --sharding "$3" \
    > "$work/$1.log" 2>&1 || { cat "$work/$1.log"; exit 1; }
  grep -E 'resumed|epoch   4/4|hash' "$work/$1.log"
  grep -q 'resumed from .* at step 69 (epoch 3 done)' "$work/$1.log" || { cat "$work/$1.log"; exit 1; }
  grep -q 'epoch   4/4' "$work/$1.log" || { cat "$work/$1.log"; exit 1; }
}
resume_from_fsdp zero1-1 1 zero1
resume_from_fsdp ddp-1 1 ddp
# One rank: OSS owns every parameter, so zero1 continues exactly as ddp does.
[[ "$(hash_of "$work/zero1-1.log")" == "$(hash_of "$work/ddp-1.log")" ]] \
  || { echo "FAIL: zero1 on 1 rank: $(hash_of "$work/zero1-1.log"), ddp: $(hash_of "$work/ddp-1.log")"; exit 1; }

echo "== and with --sharding zero2 on 2 ranks: where fsdp continuing ends"
resume_from_fsdp zero2-2 2 zero2
resume_from_fsdp fsdp-2 2 fsdp
[[ "$(hash_of "$work/zero2-2.log")" == "$(hash_of "$work/fsdp-2.log")" ]] \
  || { echo "FAIL: zero2 after fsdp: $(hash_of "$work/zero2-2.log"), fsdp on: $(hash_of "$work/fsdp-2.log")"; exit 1; }
echo "PASS: fsdp resumed bit for bit ($ref_hash); checkpoints crossed ddp@2 -> fsdp@4, fsdp@2 -> zero1@1, zero2@2"
