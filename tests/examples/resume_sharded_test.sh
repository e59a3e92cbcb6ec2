#!/usr/bin/env bash
# The resume guarantee in the sharded modes, on 2 ranks: train_digits --sharding fsdp
# under troupe-run, rank 1 killed (a crash fault, as kill -9) in the middle of epoch 2,
# relaunched and resumed from its last mid-epoch checkpoint, ends bit for bit where an
# uninterrupted fsdp run ends (parameter hash, and `troupe-ckpt diff` of the two final
# checkpoints). Then checkpoints cross modes, as the files are the same in every mode:
# a ddp run's checkpoint resumes with --sharding fsdp and trains on; the fsdp run's
# resumes with --sharding zero1 and with --sharding zero2.
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
TROUPE_FAULT=rank=1,step=40,kind=crash,restart=0 \
  "$troupe_run" -np 2 --max-restarts 2 --checkpoint-dir "$work/crash" --backoff 0 -- "$train" "${common[@]}" \
  --sharding fsdp > "$work/crash.log" 2>&1 || { cat "$work/crash.log"; exit 1; }
grep -E 'failure|resumed|hash' "$work/crash.log"
grep -Eq 'resumed from .* at step (28|35) \(epoch 2, in progress\)' "$work/crash.log" \
  || { cat "$work/crash.log"; echo "FAIL: did not resume from a mid-epoch checkpoint of epoch 2"; exit 1; }
crash_hash=$(hash_of "$work/crash.log")
[[ "$crash_hash" == "$ref_hash" ]] || { echo "FAIL: $crash_hash after the crash, $ref_hash without"; exit 1; }
"$ckpt" diff "$(last "$work/ref")" "$(last "$work/crash")" || { echo "FAIL: final checkpoints differ"; exit 1; }

echo "== a ddp checkpoint (epoch 2 done) resumed with --sharding fsdp"
"${mpi[@]}" "$train" --epochs 2 --checkpoint-dir "$work/ddp" > "$work/ddp.log" 2>&1 || { cat "$work/ddp.log"; exit 1; }
"${mpi[@]}" "$train" --epochs 3 --checkpoint-dir "$work/ddp" --sharding fsdp > "$work/ddp-fsdp.log" 2>&1 \
  || { cat "$work/ddp-fsdp.log"; exit 1; }
grep -E 'resumed|epoch   3/3|hash' "$work/ddp-fsdp.log"
grep -q 'resumed from .* at step 46 (epoch 2 done)' "$work/ddp-fsdp.log" || { cat "$work/ddp-fsdp.log"; exit 1; }
grep -q 'epoch   3/3' "$work/ddp-fsdp.log" || { cat "$work/ddp-fsdp.log"; exit 1; }

echo "== the fsdp run's checkpoint (epoch 3 done) resumed with --sharding zero1, then zero2"
for mode in zero1 zero2; do
  cp -r "$work/crash" "$work/$mode"
  "${mpi[@]}" "$train" --epochs 4 --checkpoint-dir "$work/$mode" --sharding "$mode" > "$work/$mode.log" 2>&1 \
    || { cat "$work/$mode.log"; exit 1; }
  grep -E 'resumed|epoch   4/4|hash' "$work/$mode.log"
  grep -q 'resumed from .* at step 69 (epoch 3 done)' "$work/$mode.log" || { cat "$work/$mode.log"; exit 1; }
  grep -q 'epoch   4/4' "$work/$mode.log" || { cat "$work/$mode.log"; exit 1; }
done
# The same four epochs in fsdp without a break: zero1/zero2 continue to the same parameters.
"${mpi[@]}" "$train" --epochs 4 --checkpoint-dir "$work/crash" --sharding fsdp > "$work/fsdp4.log" 2>&1 \
  || { cat "$work/fsdp4.log"; exit 1; }
for mode in zero1 zero2; do
  [[ "$(hash_of "$work/$mode.log")" == "$(hash_of "$work/fsdp4.log")" ]] \
    || { echo "FAIL: $mode after fsdp: $(hash_of "$work/$mode.log"), fsdp on: $(hash_of "$work/fsdp4.log")"; exit 1; }
done
echo "PASS: fsdp resumed bit for bit ($ref_hash); checkpoints crossed ddp -> fsdp -> zero1/zero2"
