#!/bin/bash
# ucp-reshard --format dcp checked by torch 2.6's own DCP reader (scripts/dcp_real_check.py) in the
# Debian trixie chroot; not part of CI (the chroot is not in the repo). Run on the host as root:
#
#   scripts/dcp_real_check.sh WORK [BUILD_DIR]      WORK: a scratch folder under /work/scratch
#
# 1. ucp-convert the real DeepSpeed Llama case, ucp-reshard it to DCP on dp=1, dp=2, tp=2 and
#    dp=2,tp=2 (FSDP2 over TP, 4 processes); the
#    real DCP cases (FSDP2 dp=2, TP 2) converted and written back on their own mesh; the real
#    Megatron-Core Llama (tests/data/real-mcore/llama_tp2) on tp=2, dp=2 and dp=1, against Megatron's
#    own full state and logits;
# 2. the reference logits: tests/python/harness_logits.py (host torch, the DeepSpeed harness's model);
# 3. in the chroot: dcp_to_torch_save, then dcp.load into torchtitan's Llama on each mesh;
# 4. the record -> tests/data/dcp-target/real_reader.json (dcp_target.py checks ucp's output against it).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(realpath -m "$1")
BUILD=${2:-$REPO/build}
CH=/work/oracle-hf/trixie
CASE=/work/shared/real-deepspeed/cases/llama_tp2_dp2_zero1_fp32
HARNESS=/work/shared/real-dcp/harness
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
case "$WORK" in /work/scratch/*) ;; *) echo "WORK must be under /work/scratch (seen in the chroot)"; exit 2 ;; esac

mounted() { grep -q " $1 " /proc/mounts; }
mounted $CH/proc || mount -t proc proc $CH/proc
mounted $CH/dev/shm || mount --bind /dev/shm $CH/dev/shm   # torch.multiprocessing's semaphores
mkdir -p /work/scratch "$CH/work/scratch"
mounted "$CH/work/scratch" || mount --bind /work/scratch "$CH/work/scratch"  # the record is written there
mount -o remount,bind,rw "$CH/work/scratch"
for d in /work/shared "$REPO"; do
  mkdir -p "$CH$d"
  mounted "$CH$d" || { mount --bind "$d" "$CH$d"; mount -o remount,bind,ro "$CH$d" 2>/dev/null || true; }
done

rm -rf "$WORK" && mkdir -p "$WORK"
mpirun --oversubscribe -np 2 "$BUILD/apps/ucp-convert" "$CASE/ckpt" -o "$WORK/atomic" --quiet
specs=()
for mesh in dp=1 dp=2 tp=2 dp=2,tp=2; do
  out="$WORK/dcp-$(echo "$mesh" | tr -d = | tr , -)"
  mpirun --oversubscribe -np 2 "$BUILD/apps/ucp-reshard" "$WORK/atomic" -o "$out" --format dcp --mesh "$mesh" --quiet
  specs+=("$out:$mesh")
done
for c in fsdp2_dp2:dp=2 tp2:tp=2; do  # the real DCP cases, converted and written back on their own mesh
  name=${c%%:*}; mesh=${c#*:}
  mpirun --oversubscribe -np 2 "$BUILD/apps/ucp-convert" "/work/shared/real-dcp/cases/$name/checkpoint" -o "$WORK/$name-atomic" --quiet
  mpirun --oversubscribe -np 2 "$BUILD/apps/ucp-reshard" "$WORK/$name-atomic" -o "$WORK/$name-dcp" --format dcp --mesh "$mesh" \
    --model-config "$REPO/tests/data/hf/dcp_$name/model_config.json" --quiet
  specs+=("$WORK/$name-dcp:$mesh:/work/shared/real-dcp/cases/$name")
done
MCORE=$REPO/tests/data/real-mcore/llama_tp2  # Megatron-Core's own save: its full state and logits are the reference
mpirun --oversubscribe -np 2 "$BUILD/apps/ucp-convert" "$MCORE/checkpoint" -o "$WORK/mcore-atomic" --quiet
"$BUILD/apps/ucp-reshard" "$WORK/mcore-atomic" -o "$WORK/mcore-hf" --format hf --quiet  # its config.json: the model's facts
for mesh in tp=2 dp=2 dp=1; do
  out="$WORK/mcore/dcp-$(echo "$mesh" | tr -d =)"  # the folder's name is in .metadata: dcp_target.py's names
  mpirun --oversubscribe -np 2 "$BUILD/apps/ucp-reshard" "$WORK/mcore-atomic" -o "$out" --format dcp --mesh "$mesh" --quiet
  specs+=("$out:$mesh:mcore=$MCORE=$WORK/mcore-hf/config.json")
done
/usr/bin/python3 "$REPO/tests/python/harness_logits.py" "$CASE" --out "$WORK/reference_logits.json"
chroot $CH env -i bash -c ". /opt/hf/hfenv.sh; cd $WORK && OMP_NUM_THREADS=1 python3 $REPO/scripts/dcp_real_check.py \
  $WORK/atomic $CASE $WORK/reference_logits.json $HARNESS $WORK/real_reader.json ${specs[*]}"
mkdir -p "$REPO/tests/data/dcp-target"
cp "$WORK/real_reader.json" "$REPO/tests/data/dcp-target/real_reader.json"
echo "record: tests/data/dcp-target/real_reader.json"
