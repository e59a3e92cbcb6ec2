#!/usr/bin/env bash
# kill -9 of one rank under mpirun: every waiting caller on the surviving ranks gets
# an error within the liveness timeout (<= 2 s after the kill) instead of hanging, a
# task with retries that ran there runs again on a survivor, and the job ends with a
# message naming the dead rank.
#
#   kill_rank_test.sh MPIRUN BINARY [mpirun options...]
set -u
mpirun=$1 binary=$2
shift 2
out=$("$mpirun" -np 3 --oversubscribe --bind-to none "$@" "$binary" 2>&1)
status=$?
echo "$out"
fail() { echo "kill_rank_test: FAILED: $*"; exit 1; }
[[ $status -ne 0 ]] || fail "the job exited 0; it should end with an error after losing a rank"
for r in 0 1; do
  line=$(grep -E "^rank $r: caller got rank_lost after [0-9]+ ms" <<<"$out") || fail "rank $r's caller did not get rank_lost"
  ms=$(sed -E 's/.* after ([0-9]+) ms.*/\1/' <<<"$line")
  # The kill comes 300 ms after the ask; the error must follow within 2 s of it.
  ((ms - 300 <= 2000)) || fail "rank $r waited $ms ms"
done
grep -qE "rank\(s\) 2 were lost; ending the whole job" <<<"$out" || fail "no message naming the dead rank"
grep -qE "^rank 0: the task was retried on rank [01]$" <<<"$out" || fail "the task on the lost rank was not retried elsewhere"
echo "kill_rank_test: passed"
