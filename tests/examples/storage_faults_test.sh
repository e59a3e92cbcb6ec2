#!/usr/bin/env bash
# Faults of storage and of the folder, end to end with train_digits on 2 ranks (issue
# 49): a resume meets its checkpoints briefly locked (retried: goes on from step 46, not
# step 0), locked for longer (fails loudly, nothing lost), all damaged (refused, set
# aside; --fresh starts over and keeps them), or of another run (refused with what
# differs; --allow-other-run takes it); a second job in a folder in use is refused. Then a
# disk that fills up under troupe-run: the failed saves are events, the job stops after
# two in a row, troupe-run waits --storage-wait for room and, when none comes, does not
# relaunch into the full disk, and nothing crashes at exit; when room comes, it
# relaunches and the job finishes.
#
#   storage_faults_test.sh TROUPE_RUN TRAIN_DIGITS
set -euo pipefail
troupe_run=$1 train=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run() { mpirun -np 2 "$train" "$@"; }

echo "== a 2-epoch run: checkpoints at steps 23 and 46"
run --epochs 2 --checkpoint-dir "$work/a" > "$work/first.log" 2>&1 || { cat "$work/first.log"; fail "first run"; }
[[ $(cat "$work/a/latest") == ckpt-000000046.h5 ]] || fail "latest is $(cat "$work/a/latest")"

echo "== its files locked for 1.5 s while a resume starts: retried, resumed at step 46"
for f in "$work"/a/ckpt-*.h5; do flock -x "$f" sleep 1.5 & done
sleep 0.2
run --epochs 3 --checkpoint-dir "$work/a" > "$work/locked.log" 2>&1 || { cat "$work/locked.log"; fail "resume after a lock"; }
wait
grep -q "cannot read a checkpoint now, retrying" "$work/locked.log" || { cat "$work/locked.log"; fail "no retry reported"; }
grep -q "resumed from .* at step 46" "$work/locked.log" || { cat "$work/locked.log"; fail "did not resume at step 46"; }
grep -q "69 steps" "$work/locked.log" || { cat "$work/locked.log"; fail "did not end at step 69"; }
[[ $(cat "$work/a/latest") == ckpt-000000069.h5 ]] || fail "latest is $(cat "$work/a/latest")"

echo "== locked for longer than the retry window: a loud failure, every file kept"
cp -r "$work/a" "$work/b"
for f in "$work"/b/ckpt-*.h5; do flock -x "$f" sleep 4 & done
sleep 0.2
set +e
TROUPE_STORAGE_RETRY_S=1 run --epochs 4 --checkpoint-dir "$work/b" > "$work/stuck.log" 2>&1
status=$?
set -e
wait
[[ $status -ne 0 ]] || { cat "$work/stuck.log"; fail "a resume that cannot read its checkpoint succeeded"; }
grep -q "cannot resume from .* now: .*ckpt-000000069.h5.*EAGAIN" "$work/stuck.log" || { cat "$work/stuck.log"; fail "no errno and path"; }
! grep -q "skipping" "$work/stuck.log" || { cat "$work/stuck.log"; fail "a locked file was skipped"; }
[[ $(cat "$work/b/latest") == ckpt-000000069.h5 ]] || fail "latest moved to $(cat "$work/b/latest")"
diff <(ls "$work/a") <(ls "$work/b") > /dev/null || fail "files changed: $(ls "$work/b")"

echo "== every checkpoint damaged: refused, set aside, never a silent start from step 0"
for f in "$work"/b/ckpt-*.h5; do truncate -s 4096 "$f"; done
set +e
run --epochs 4 --checkpoint-dir "$work/b" > "$work/damaged.log" 2>&1
status=$?
set -e
[[ $status -ne 0 ]] || { cat "$work/damaged.log"; fail "trained from scratch over damaged checkpoints"; }
grep -q "Not starting over from step 0" "$work/damaged.log" || { cat "$work/damaged.log"; fail "no reason given"; }
[[ $(ls "$work"/b/*.damaged | wc -l) -eq 3 ]] || fail "not set aside: $(ls "$work/b")"
run --epochs 1 --checkpoint-dir "$work/b" --fresh > "$work/fresh.log" 2>&1 || { cat "$work/fresh.log"; fail "--fresh"; }
grep -q "23 steps" "$work/fresh.log" || { cat "$work/fresh.log"; fail "--fresh did not train from step 0"; }
[[ $(ls -d "$work"/b/superseded-* | wc -l) -eq 1 ]] || fail "no superseded folder: $(ls "$work/b")"
[[ $(ls "$work"/b/superseded-*/*.damaged | wc -l) -eq 3 ]] || fail "the old files were not kept"

echo "== a checkpoint of another run: refused with what differs, taken when allowed"
set +e
run --epochs 4 --lr 0.1 --checkpoint-dir "$work/a" > "$work/other.log" 2>&1
status=$?
set -e
[[ $status -ne 0 ]] || { cat "$work/other.log"; fail "resumed another run's weights"; }
grep -q "lr 0.050000000000000003 in the file, 0.10000000000000001 in this run" "$work/other.log" \
  || { cat "$work/other.log"; fail "no diff"; }
run --epochs 4 --lr 0.1 --allow-other-run --checkpoint-dir "$work/a" > "$work/allowed.log" 2>&1 \
  || { cat "$work/allowed.log"; fail "--allow-other-run"; }
grep -q "resumed from .* at step 69" "$work/allowed.log" || { cat "$work/allowed.log"; fail "not resumed when allowed"; }

echo "== a relaunch whose ranks see an empty folder where troupe-run saw step 46: refused"
set +e
TROUPE_CHECKPOINT_DIR="$work/elsewhere" TROUPE_CHECKPOINT_STEP=46 TROUPE_RESTART=1 run --epochs 2 > "$work/elsewhere.log" 2>&1
status=$?
set -e
[[ $status -ne 0 ]] || { cat "$work/elsewhere.log"; fail "started over in a folder troupe-run does not see"; }
grep -q "where troupe-run saw one of step 46" "$work/elsewhere.log" || { cat "$work/elsewhere.log"; fail "no reason"; }

echo "== two jobs in one folder: the second is refused naming the first, which keeps it"
mpirun -np 2 "$train" --epochs 400 --checkpoint-dir "$work/c" > "$work/long.log" 2>&1 &
long=$!  # mpirun's own pid: a SIGTERM to it ends its ranks
for _ in $(seq 100); do grep -q "pid=" "$work/c/.troupe-lock" 2> /dev/null && break; sleep 0.1; done
set +e
run --epochs 1 --lr 0.2 --checkpoint-dir "$work/c" > "$work/second.log" 2>&1
status=$?
set -e
[[ $status -ne 0 ]] || { cat "$work/second.log"; fail "a second job trained in a folder in use"; }
grep -q "is in use by run" "$work/second.log" || { cat "$work/second.log"; fail "the owner was not named"; }
kill -TERM "$long" 2> /dev/null || true
wait "$long" 2> /dev/null || true
run --epochs 1 --checkpoint-dir "$work/c" --fresh > "$work/after.log" 2>&1 || { cat "$work/after.log"; fail "the lock of a job that ended was not taken over"; }

echo "== a disk that fills up under troupe-run (a 1 MB tmpfs; a checkpoint takes 0.7 MB)"
if ! unshare -m true 2> /dev/null; then echo "SKIP: no mount namespace here"; exit 0; fi
set +e
unshare -m bash -c '
  mkdir -p "$1/tiny" && mount -t tmpfs -o size=1m tmpfs "$1/tiny" || exit 77
  "$2" -np 2 --checkpoint-dir "$1/tiny/ckpt" --events "$1/events.jsonl" --backoff 0 --max-restarts 3 \
    --storage-wait 1 -- "$3" --epochs 2 --save-every 5
' _ "$work" "$troupe_run" "$train" > "$work/full.log" 2>&1
status=$?
set -e
[[ $status -eq 77 ]] && { echo "SKIP: cannot mount a tmpfs here"; exit 0; }
[[ $status -eq 1 ]] || { cat "$work/full.log"; fail "troupe-run exit status $status, want 1"; }
! grep -qiE "segmentation fault|signal 11|SIGSEGV" "$work/full.log" || { cat "$work/full.log"; fail "a crash"; }
# Rank 0 says "2 saves in a row failed"; rank 1 may stop first, and troupe-run then ends
# rank 0 before it prints, so either rank's word counts.
stopped="2 saves in a row failed|stops with the checkpoint writer \\(rank 0\\), whose save failed"
grep -qE "$stopped" "$work/full.log" || { cat "$work/full.log"; fail "the job did not stop after 2 failed saves"; }
grep -q '"event": "save_failed".*ENOSPC' "$work/events.jsonl" || { cat "$work/events.jsonl"; fail "no save_failed event"; }
grep -q '"event": "storage_wait"' "$work/events.jsonl" || { cat "$work/events.jsonl"; fail "no wait for room"; }
grep -q '"event": "storage_full"' "$work/events.jsonl" || { cat "$work/events.jsonl"; fail "no storage_full event"; }
grep -q "not relaunching: .* bytes free" "$work/full.log" || { cat "$work/full.log"; fail "relaunched into the full disk"; }
! grep -q '"event": "restart"' "$work/events.jsonl" || { cat "$work/events.jsonl"; fail "restarted into a full disk"; }

echo "== a disk filled under troupe-run, then freed while it waits for room: relaunched, finished"
# A filler leaves room for one checkpoint (1 MB), so the saves after the first fail; it
# goes once troupe-run says it waits for room (the storage_wait event).
set +e
unshare -m bash -c '
  mkdir -p "$1/roomy" && mount -t tmpfs -o size=8m tmpfs "$1/roomy" || exit 77
  mkdir -p "$1/roomy/ckpt"
  free=$(df --output=avail -B1 "$1/roomy" | tail -1)
  head -c $((free - 1000000)) /dev/zero > "$1/roomy/filler"
  (
    until grep -qs "\"event\": \"storage_wait\"" "$1/freed.jsonl"; do sleep 0.02; done
    rm -f "$1/roomy/filler"
  ) &
  "$2" -np 2 --checkpoint-dir "$1/roomy/ckpt" --events "$1/freed.jsonl" --backoff 0 --max-restarts 3 \
    --storage-wait 60 -- "$3" --epochs 20 --save-every 5
' _ "$work" "$troupe_run" "$train" > "$work/freed.log" 2>&1
status=$?
set -e
[[ $status -eq 0 ]] || { cat "$work/freed.log"; fail "troupe-run exit status $status, want 0"; }
grep -qE "$stopped" "$work/freed.log" || { cat "$work/freed.log"; fail "the saves did not fail"; }
grep -q "room in the checkpoint folder again after" "$work/freed.log" || { cat "$work/freed.log"; fail "no room"; }
grep -q '"event": "restart"' "$work/freed.jsonl" || { cat "$work/freed.jsonl"; fail "not relaunched"; }
! grep -q '"event": "storage_full"' "$work/freed.jsonl" || { cat "$work/freed.jsonl"; fail "gave up"; }
grep -q "460 steps" "$work/freed.log" || { cat "$work/freed.log"; fail "did not finish 20 epochs"; }
echo "PASS"
