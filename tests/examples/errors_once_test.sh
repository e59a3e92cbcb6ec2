#!/usr/bin/env bash
# An error every rank hits is printed once, by rank 0, naming the ranks, with its
# context once and the actor as the program wrote it: `mpirun -np 3 train_digits`
# with a global batch that does not split into 3 micro-batches, and with a data file
# that does not exist.
#
#   errors_once_test.sh TRAIN_DIGITS
set -euo pipefail
train=$1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "FAIL: $*"; exit 1; }
check() {
  local expected=$1; shift
  local out
  out=$(timeout 60 mpirun -np 3 --oversubscribe --bind-to none "$train" "$@" 2>&1) && fail "$* exited 0"
  echo "$out" | grep "train_digits"
  [ "$(grep -c "train_digits: error:" <<< "$out")" -eq 1 ] || fail "$*: the error is not printed exactly once"
  grep -q "error: spawn failed on ranks 0, 1, 2 \[actor TrainWorker<DigitsRecipe>, constructor\]: " <<< "$out" \
    || fail "$*: the error does not name the ranks and the actor as written"
  grep -qF "$expected" <<< "$out" || fail "$*: '$expected' is missing"
  if grep -qE "anonymous namespace|troupe::train::TrainWorker|\[rank [0-9]+, actor" <<< "$out"; then
    fail "$*: a demangled name or a per-rank context"
  fi
}
check "the global batch of 64 does not split into 3 equal micro-batches" --accum-steps 3
check "digits data file '/nonexistent/digits.csv' does not exist" --data /nonexistent/digits.csv
echo PASS
