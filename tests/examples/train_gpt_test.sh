#!/usr/bin/env bash
# train_gpt end to end, on 2 ranks (layouts: 4). One part per call:
#   quick   the quick preset reaches val loss <= 2.0; every evaluation prints "val loss"
#           and MFU (also in the JSONL), the end "final val loss" and a sample; the
#           checkpoint's root records the vocabulary and nanoGPT's model_args; PyTorch
#           (tools/load_in_torch.py) gets troupe's validation loss from that checkpoint
#           to 1e-4.
#   resume  in every sharding mode, rank 1 killed (a crash fault, as kill -9) under
#           troupe-run, relaunched and resumed: the same parameters as a run that never
#           failed (hash, and troupe-ckpt diff of the final checkpoints); zero2 and
#           fsdp end with ddp's parameters.
#   recompute  --activation-checkpointing (every block, every other block) trains to the
#           parameters of the run without it, with dropout on, in ddp and fsdp.
#   layouts (4 ranks) tensor and pipeline parallelism: dp 4, dp 2 x tp 2 (ddp, zero2
#           and fsdp over dp, and ddp with sequence parallelism), tp 4, dp 2 x pp 2 (ddp
#           and zero1 over dp) and pp 2 x tp 2 end with the same validation loss (1e-4),
#           pp 2's zero1 with its ddp's bits; a dp 2 x tp 2 checkpoint resumes as dp 4,
#           as tp 4, as dp 2 x pp 2 and as pp 2 x tp 2, a dp 4 one as dp 2 x tp 2 (ddp
#           and fsdp) and as pp 2 with zero1, a dp 2 x pp 2 one as dp 4 and as dp 2 x
#           tp 2 (and with zero1, as dp 2 x tp 2), a pp 2 x tp 2 one as dp 4, an fsdp x
#           tp 2 one as pp 2 x tp 2, a sequence-parallel one as dp 4, each ending there
#           too; rank 1 killed under troupe-run at dp 2 x tp 2, dp 2 x pp 2 and pp 2 x
#           tp 2 resumes bit for bit.
#   layouts8 (8 ranks) dp 2 x pp 2 x tp 2 ends with dp 2's validation loss (1e-4) and
#           resumes dp 2's checkpoint there too; dp 2 x interleaved pp 4 (8 blocks) ends
#           with dp 2's loss on the same model.
#   bad     bad input is refused with a message naming the file and the mismatch, and
#           no checkpoint is written over.
#
#   train_gpt_test.sh quick|resume|recompute|layouts|layouts8|bad TRAIN_GPT TROUPE_RUN TROUPE_CKPT SOURCE_DIR
set -euo pipefail
part=$1 train=$2 troupe_run=$3 ckpt=$4 source=$5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun -np 2 --oversubscribe --bind-to none)
hash_of() { grep -o 'parameters hash [0-9a-f]*' "$1"; }
last() { ls "$1"/ckpt-*.h5 | sort | tail -1; }
fail() { echo "FAIL: $*"; exit 1; }
short=(--steps 60 --warmup-steps 5 --eval-every 20 --eval-samples 64 --save-every 10 --sample-chars 0)

case "$part" in
quick)
  "${mpi[@]}" "$train" --preset quick --checkpoint-dir "$work/ckpt" --metrics "$work/gpt.jsonl" \
    --require-val-loss 2.0 > "$work/quick.log" 2>&1 || { cat "$work/quick.log"; fail "the quick preset"; }
  grep -E 'step|final|hash' "$work/quick.log"
  [[ $(grep -c ' val loss [0-9]' "$work/quick.log") -ge 8 ]] || fail "not a val loss line per evaluation"
  loss=$(grep -o 'final val loss [0-9.]*' "$work/quick.log" | awk '{print $4}')
  grep -A3 '^sample (temperature' "$work/quick.log" | tail -n +2 | grep -q '[a-z]' || fail "no sample passage"
  [[ $(wc -l < "$work/gpt.jsonl") -eq 8 ]] || fail "expected 8 JSONL records"
  grep -Eq 'tokens/s  MFU [0-9.]+%' "$work/quick.log" || fail "no MFU on the progress lines"
  /usr/bin/python3 -c 'import json, sys; m = [json.loads(l)["mfu"] for l in open(sys.argv[1])]; sys.exit(not all(0 < x < 2 for x in m))' \
    "$work/gpt.jsonl" || fail "the JSONL's mfu is missing or out of (0, 2)"
  /usr/bin/python3 - "$(last "$work/ckpt")" "$source/data/moby_dick.txt.gz" <<'PY' || fail "checkpoint attributes"
import gzip, json, sys
import h5py
f = h5py.File(sys.argv[1], "r")
vocab = f.attrs["vocab"].decode()  # fixed-length strings come back as bytes
text = gzip.open(sys.argv[2], "rt", encoding="utf-8").read()
assert vocab == "".join(sorted(set(text))), "vocab is not the sorted set of the file's characters"
args = json.loads(f.attrs["model_args"])
assert args == {"n_layer": 2, "n_head": 4, "n_embd": 128, "block_size": 64, "vocab_size": len(vocab)}, args
config = json.loads(f.attrs["config"])
assert all(config[k] == v for k, v in args.items()), config
print(f"checkpoint root: vocab of {len(vocab)} characters, model_args {args}")
PY
  torch=$(/usr/bin/python3 "$source/tools/load_in_torch.py" "$(last "$work/ckpt")" \
          --gpt-val-loss "$source/data/moby_dick.txt.gz" --eval-samples 256 | awk '{print $3}')
  echo "troupe final val loss $loss, PyTorch on the same checkpoint $torch"
  awk -v a="$loss" -v b="$torch" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-4 * b) }' \
    || fail "PyTorch's validation loss $torch differs from troupe's $loss by more than 1e-4"
  ;;
resume)
  for mode in ddp zero1 zero2 fsdp; do
    echo "== $mode"
    "$troupe_run" -np 2 --checkpoint-dir "$work/$mode-ref" --backoff 0 -- "$train" "${short[@]}" \
      --sharding "$mode" > "$work/$mode-ref.log" 2>&1 || { cat "$work/$mode-ref.log"; fail "$mode reference"; }
    TROUPE_FAULT_ARMED=1 TROUPE_FAULT=rank=1,step=35,kind=crash,restart=0 \
      "$troupe_run" -np 2 --max-restarts 2 --checkpoint-dir "$work/$mode-crash" --backoff 0 -- "$train" \
      "${short[@]}" --sharding "$mode" > "$work/$mode-crash.log" 2>&1 \
      || { cat "$work/$mode-crash.log"; fail "$mode after the crash"; }
    grep -E 'resumed|hash' "$work/$mode-crash.log"
    grep -Eq 'resumed from .* at step (20|30)' "$work/$mode-crash.log" \
      || { cat "$work/$mode-crash.log"; fail "$mode did not resume from a checkpoint"; }
    [[ "$(hash_of "$work/$mode-crash.log")" == "$(hash_of "$work/$mode-ref.log")" ]] \
      || fail "$mode: $(hash_of "$work/$mode-crash.log") after the crash, $(hash_of "$work/$mode-ref.log") without"
    "$ckpt" diff "$(last "$work/$mode-ref")" "$(last "$work/$mode-crash")" > /dev/null \
      || fail "$mode: the final checkpoints differ"
  done
  # zero2 and fsdp step flat shards: AdamW still decays the matrices only, as in ddp,
  # so all three end with the same parameters (zero1's clipping norm sums in another
  # order, so it agrees only to rounding).
  for mode in zero2 fsdp; do
    [[ "$(hash_of "$work/$mode-ref.log")" == "$(hash_of "$work/ddp-ref.log")" ]] \
      || fail "$mode ends with $(hash_of "$work/$mode-ref.log"), ddp with $(hash_of "$work/ddp-ref.log")"
  done
  echo "PASS: every mode resumed bit for bit; zero2 and fsdp trained as ddp"
  ;;
recompute)
  run() {  # name, flags...
    local name=$1
    shift
    "${mpi[@]}" "$train" "${short[@]}" --steps 30 --dropout 0.1 "$@" > "$work/$name.log" 2>&1 \
      || { cat "$work/$name.log"; fail "$name"; }
    hash_of "$work/$name.log" | sed "s/^/$name: /"
  }
  run plain --sharding ddp
  run ddp-every-1 --sharding ddp --activation-checkpointing 1
  run fsdp-every-2 --sharding fsdp --activation-checkpointing 2
  for name in ddp-every-1 fsdp-every-2; do
    [[ "$(hash_of "$work/$name.log")" == "$(hash_of "$work/plain.log")" ]] \
      || fail "$name ends with $(hash_of "$work/$name.log"), the run without recompute with $(hash_of "$work/plain.log")"
  done
  echo "PASS: recomputed activations train bit for bit as stored ones"
  ;;
layouts)
  mpi=(mpirun -np 4 --oversubscribe --bind-to none)
  steps=(--steps 30 --warmup-steps 5 --eval-every 20 --eval-samples 64 --sample-chars 0 --save-every 10)
  loss_of() { grep -o 'final val loss [0-9.]*' "$1" | awk '{print $4}'; }
  run() {  # name, flags...
    local name=$1
    shift
    "${mpi[@]}" "$train" "${steps[@]}" "$@" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "$name"; }
    echo "$name: $(grep -E 'resumed from' "$work/$name.log" || true) final val loss $(loss_of "$work/$name.log")"
  }
  near() {  # name [reference]: its final loss within 1e-4 of the reference's (dp4's)
    local ref=${2:-dp4}
    awk -v a="$(loss_of "$work/$1.log")" -v b="$(loss_of "$work/$ref.log")" \
      'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-4 * b) }' \
      || fail "$1 ends at val loss $(loss_of "$work/$1.log"), $ref at $(loss_of "$work/$ref.log")"
  }
  # The step-20 checkpoint of a run's folder, alone in a copy of it.
  from20() { mkdir -p "$work/$2" && cp "$work/$1"/ckpt-000000020.h5 "$work/$2"/; }
  run dp4 --checkpoint-dir "$work/dp4"
  run tp2 --tp 2 --checkpoint-dir "$work/tp2"
  run tp4 --tp 4
  run pp2 --pp 2 --schedule gpipe --checkpoint-dir "$work/pp2"
  run pp2tp2 --pp 2 --tp 2 --checkpoint-dir "$work/pp2tp2"
  run tp2fsdp --tp 2 --sharding fsdp --checkpoint-dir "$work/tp2fsdp"
  run tp2zero2 --tp 2 --sharding zero2
  run pp2zero1 --pp 2 --sharding zero1 --checkpoint-dir "$work/pp2zero1"
  run pp2fsdp --pp 2 --schedule gpipe --sharding fsdp --checkpoint-dir "$work/pp2fsdp"
  run pp2zb --pp 2 --schedule zero-bubble
  run tp2sp --tp 2 --sequence-parallel --checkpoint-dir "$work/tp2sp"
  near tp2 && near tp4 && near pp2 && near pp2tp2 && near tp2fsdp && near tp2zero2 && near pp2zero1 && near tp2sp
  # ZeRO-1 and the pipeline's FSDP step each parameter once, on its owner, with the same
  # arithmetic, and zero-bubble adds each weight's gradients in GPipe's order: pp 2's bits.
  for mode in zero1 fsdp zb; do
    [[ "$(hash_of "$work/pp2$mode.log")" == "$(hash_of "$work/pp2.log")" ]] \
      || fail "pp 2 with $mode ends at $(hash_of "$work/pp2$mode.log"), with ddp at $(hash_of "$work/pp2.log")"
  done
  from20 tp2 tp2-as-dp4 && run tp2-as-dp4 --checkpoint-dir "$work/tp2-as-dp4"
  from20 tp2 tp2-as-tp4 && run tp2-as-tp4 --tp 4 --checkpoint-dir "$work/tp2-as-tp4"
  from20 tp2 tp2-as-pp2 && run tp2-as-pp2 --pp 2 --checkpoint-dir "$work/tp2-as-pp2"
  from20 dp4 dp4-as-tp2 && run dp4-as-tp2 --tp 2 --checkpoint-dir "$work/dp4-as-tp2"
  from20 pp2 pp2-as-dp4 && run pp2-as-dp4 --checkpoint-dir "$work/pp2-as-dp4"
  from20 pp2 pp2-as-tp2 && run pp2-as-tp2 --tp 2 --checkpoint-dir "$work/pp2-as-tp2"
  from20 tp2 tp2-as-pp2tp2 && run tp2-as-pp2tp2 --pp 2 --tp 2 --checkpoint-dir "$work/tp2-as-pp2tp2"
  from20 pp2tp2 pp2tp2-as-dp4 && run pp2tp2-as-dp4 --checkpoint-dir "$work/pp2tp2-as-dp4"
  from20 tp2fsdp tp2fsdp-as-pp2tp2 && run tp2fsdp-as-pp2tp2 --pp 2 --tp 2 --checkpoint-dir "$work/tp2fsdp-as-pp2tp2"
  from20 dp4 dp4-as-tp2fsdp && run dp4-as-tp2fsdp --tp 2 --sharding fsdp --checkpoint-dir "$work/dp4-as-tp2fsdp"
  from20 dp4 dp4-as-pp2zero1 && run dp4-as-pp2zero1 --pp 2 --sharding zero1 --checkpoint-dir "$work/dp4-as-pp2zero1"
  from20 pp2zero1 pp2zero1-as-tp2 && run pp2zero1-as-tp2 --tp 2 --checkpoint-dir "$work/pp2zero1-as-tp2"
  from20 pp2fsdp pp2fsdp-as-tp2 && run pp2fsdp-as-tp2 --tp 2 --checkpoint-dir "$work/pp2fsdp-as-tp2"
  from20 dp4 dp4-as-pp2fsdp && run dp4-as-pp2fsdp --pp 2 --sharding fsdp --checkpoint-dir "$work/dp4-as-pp2fsdp"
  from20 tp2sp tp2sp-as-dp4 && run tp2sp-as-dp4 --checkpoint-dir "$work/tp2sp-as-dp4"
  for name in tp2-as-dp4 tp2-as-tp4 tp2-as-pp2 dp4-as-tp2 pp2-as-dp4 pp2-as-tp2 tp2-as-pp2tp2 pp2tp2-as-dp4 \
              tp2fsdp-as-pp2tp2 dp4-as-tp2fsdp dp4-as-pp2zero1 pp2zero1-as-tp2 pp2fsdp-as-tp2 dp4-as-pp2fsdp \
              tp2sp-as-dp4; do
    grep -q 'resumed from .* at step 20' "$work/$name.log" || fail "$name did not resume from step 20"
    near "$name"
  done
  # Interleaved pp 2 (two stages a rank) needs 4 blocks: against dp 4 of the same model.
  run dp4l4 --n-layer 4 --checkpoint-dir "$work/dp4l4"
  run pp2i --n-layer 4 --pp 2 --schedule interleaved --checkpoint-dir "$work/pp2i"
  from20 pp2i pp2i-as-dp4 && run pp2i-as-dp4 --n-layer 4 --checkpoint-dir "$work/pp2i-as-dp4"
  for name in pp2i pp2i-as-dp4; do near "$name" dp4l4; done
  grep -q 'resumed from .* at step 20' "$work/pp2i-as-dp4.log" || fail "pp2i-as-dp4 did not resume from step 20"
  for name in tp2 pp2 pp2tp2; do
    layout=$(sed -E 's/(tp|pp)([0-9])/--\1 \2 /g' <<< "$name")
    # shellcheck disable=SC2086 # $layout is flags
    TROUPE_FAULT_ARMED=1 TROUPE_FAULT=rank=1,step=25,kind=crash,restart=0 \
      "$troupe_run" -np 4 --max-restarts 2 --checkpoint-dir "$work/$name-crash" --backoff 0 -- "$train" \
      "${steps[@]}" $layout > "$work/$name-crash.log" 2>&1 \
      || { cat "$work/$name-crash.log"; fail "$layout after the crash"; }
    grep -Eq 'resumed from .* at step 20' "$work/$name-crash.log" || { cat "$work/$name-crash.log"; fail "no resume"; }
    [[ "$(hash_of "$work/$name-crash.log")" == "$(hash_of "$work/$name.log")" ]] \
      || fail "$layout: $(hash_of "$work/$name-crash.log") after the crash, $(hash_of "$work/$name.log") without"
  done
  echo "PASS: every layout (interleaved pp 2 too) trains as dp 4 and resumes any other's checkpoint"
  echo "      (interleaved: its checkpoint resumes as dp 4; loading one is Pipeline.InterleavedStages...);"
  echo "      tp 2, pp 2 and pp 2 x tp 2 resumed bit for bit;"
  echo "      pp 2 with zero1 ends with pp 2's bits"
  ;;
layouts8)
  steps=(--steps 30 --warmup-steps 5 --eval-every 20 --eval-samples 64 --sample-chars 0 --save-every 10)
  loss_of() { grep -o 'final val loss [0-9.]*' "$1" | awk '{print $4}'; }
  "${mpi[@]}" "$train" "${steps[@]}" --checkpoint-dir "$work/dp2" > "$work/dp2.log" 2>&1 \
    || { cat "$work/dp2.log"; fail "dp 2"; }
  mpirun -np 8 --oversubscribe --bind-to none "$train" "${steps[@]}" --pp 2 --tp 2 > "$work/grid.log" 2>&1 \
    || { cat "$work/grid.log"; fail "dp 2 x pp 2 x tp 2"; }
  mkdir "$work/resume" && cp "$work/dp2/ckpt-000000020.h5" "$work/resume/"
  # Resumed with FSDP as the grid's data parallelism.
  mpirun -np 8 --oversubscribe --bind-to none "$train" "${steps[@]}" --pp 2 --tp 2 --sharding fsdp \
    --checkpoint-dir "$work/resume" > "$work/resume.log" 2>&1 \
    || { cat "$work/resume.log"; fail "fsdp 2 x pp 2 x tp 2 from dp 2's checkpoint"; }
  grep -q 'resumed from .* at step 20' "$work/resume.log" || fail "fsdp 2 x pp 2 x tp 2 did not resume from step 20"
  # Interleaved pp 4 (two one-block stages a rank, so 8 blocks) x dp 2, against dp 2 of the same model.
  "${mpi[@]}" "$train" "${steps[@]}" --n-layer 8 > "$work/dp2l8.log" 2>&1 || { cat "$work/dp2l8.log"; fail "dp 2, 8 blocks"; }
  mpirun -np 8 --oversubscribe --bind-to none "$train" "${steps[@]}" --n-layer 8 --pp 4 --schedule interleaved \
    > "$work/pp4i.log" 2>&1 || { cat "$work/pp4i.log"; fail "dp 2 x interleaved pp 4"; }
  for pair in grid:dp2 resume:dp2 pp4i:dp2l8; do
    name=${pair%%:*} base=${pair##*:}
    echo "$name: final val loss $(loss_of "$work/$name.log"), $base $(loss_of "$work/$base.log")"
    awk -v a="$(loss_of "$work/$name.log")" -v b="$(loss_of "$work/$base.log")" \
      'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-4 * b) }' || fail "$name is not at $base's loss"
  done
  echo "PASS: dp 2 x pp 2 x tp 2 on 8 ranks trains as dp 2, and with fsdp as dp resumes its checkpoint;"
  echo "      dp 2 x interleaved pp 4 trains as dp 2"
  ;;
bad)
  expect() {  # exit status, message pattern, command...
    local status=$1 pattern=$2
    shift 2
    set +e
    "$@" > "$work/bad.log" 2>&1
    local got=$?
    set -e
    grep -Eq -- "$pattern" "$work/bad.log" && [[ $got -eq $status ]] \
      || { cat "$work/bad.log"; fail "expected exit $status and /$pattern/ from: $*"; }
    grep -E -- "$pattern" "$work/bad.log" | head -1
  }
  : > "$work/empty.txt"
  expect 1 "empty.txt: the file holds no text" "${mpi[@]}" "$train" --data "$work/empty.txt"
  head -c 20000 "$source/data/moby_dick.txt.gz" > "$work/cut.txt.gz"
  expect 1 "cut.txt.gz: compressed data is corrupt or truncated" "${mpi[@]}" "$train" --data "$work/cut.txt.gz"
  printf 'Call me Ishmael.\xff\n' > "$work/latin1.txt"
  expect 1 "latin1.txt: byte 16 .* does not start a UTF-8 character" "${mpi[@]}" "$train" --data "$work/latin1.txt"
  head -c 600 < <(gzip -dc "$source/data/moby_dick.txt.gz") > "$work/short.txt"
  expect 1 "--block-size 64 is too large for .*short.txt: its validation part has 60 characters" \
    "${mpi[@]}" "$train" --data "$work/short.txt"
  expect 2 "bad value 'tp' for --sharding" "$train" --sharding tp
  expect 2 "bad value 'gloo' for --backend: nccl or mpi" "$train" --backend gloo
  expect 2 "--backend nccl needs --device cuda" "$train" --backend nccl
  expect 2 "--activation-checkpointing must be >= 0" "$train" --activation-checkpointing -1
  expect 2 "--tp 3 must be >= 1 and divide --n-head 4" "$train" --tp 3
  expect 2 "--sequence-parallel needs --tp > 1 dividing --block-size" "$train" --sequence-parallel
  expect 1 "sequence parallelism runs over tensor_parallel > 1 ranks with ddp, no pipeline stages and on the CPU" \
    "${mpi[@]}" "$train" --tp 2 --sequence-parallel --sharding fsdp --steps 10 --warmup-steps 2
  expect 1 "tensor parallelism runs with ddp, zero2 or fsdp, .*not zero1" \
    "${mpi[@]}" "$train" --tp 2 --sharding zero1 --steps 10 --warmup-steps 2
  expect 1 "pipeline parallelism with ddp, zero1 or fsdp, .*not zero2, f32 with pipeline stages" \
    "${mpi[@]}" "$train" --pp 2 --sharding zero2 --steps 10 --warmup-steps 2
  expect 1 "tensor parallelism: dropout 0.1 is not supported yet" "${mpi[@]}" "$train" --tp 2 --dropout 0.1 --steps 10 --warmup-steps 2
  expect 2 "--pp 3 must be in \\[1, --n-layer 2\\]" "$train" --pp 3
  expect 2 "--schedule interleaved needs --pp > 1, --micro-batches a multiple of --pp, and --pp x --virtual-stages 4 stages within --n-layer 2" \
    "$train" --pp 2 --schedule interleaved
  expect 2 "bad value 'even' for --pp-cut: parameters or uniform" "$train" --pp 2 --pp-cut even
  expect 2 "--virtual-stages 3: 2 or more with --schedule interleaved, 1 \\(or none\\) with the others" \
    "$train" --pp 2 --virtual-stages 3
  expect 1 "with pipeline parallelism, accum_steps must be 1" "${mpi[@]}" "$train" --pp 2 --accum-steps 2 --steps 10 --warmup-steps 2
  expect 2 "--n-embd 100 must be a multiple of --n-head 3" "$train" --n-embd 100 --n-head 3
  # A checkpoint folder of one run, then runs whose vocabulary or model differ.
  "${mpi[@]}" "$train" --steps 10 --warmup-steps 2 --eval-every 10 --eval-samples 16 --sample-chars 0 \
    --checkpoint-dir "$work/ckpt" > "$work/first.log" 2>&1 || { cat "$work/first.log"; fail "the first run"; }
  before=$(sha256sum "$work"/ckpt/* | sort)
  gzip -dc "$source/data/moby_dick.txt.gz" | tr 'z' 'Z' > "$work/noz.txt"
  expect 1 "ckpt-000000010.h5 belongs to another run: its root attribute 'vocab' \(.* bytes\) differs" \
    "${mpi[@]}" "$train" --data "$work/noz.txt" --steps 20 --warmup-steps 2 --checkpoint-dir "$work/ckpt"
  expect 1 "root attribute 'model_args' is '\{\"n_layer\": 2, .*this run's is '\{\"n_layer\": 3" \
    "${mpi[@]}" "$train" --n-layer 3 --steps 20 --warmup-steps 2 --checkpoint-dir "$work/ckpt"
  [[ "$(sha256sum "$work"/ckpt/* | sort)" == "$before" ]] || fail "a refused run changed the checkpoint folder"
  echo "PASS: bad input refused, the checkpoints untouched"
  ;;
*) fail "unknown part $part" ;;
esac
