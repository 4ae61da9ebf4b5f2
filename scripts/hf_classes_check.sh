#!/bin/bash
# What transformers 5.3 reads of ucp's GPT2LMHeadModel and MixtralForCausalLM exports: run as root on
# the host after `ctest -R hf_classes` made them (BUILD/tests/work/hf_classes/*_np1). Writes
# tests/data/real-hf/exports.json (scripts/hf_classes_oracle.py check), which hf_classes then checks.
#   scripts/hf_classes_check.sh BUILD_DIR [SCRATCH]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$1" && pwd)
SCRATCH=${2:-/work/scratch/hf_classes_check}
CHROOT=/work/oracle-hf/trixie
DATA=$ROOT/tests/data/real-hf
mkdir -p "$SCRATCH" "$CHROOT$SCRATCH"
mountpoint -q "$CHROOT/proc" || mount -t proc proc "$CHROOT/proc"
mountpoint -q "$CHROOT$SCRATCH" || mount --bind "$SCRATCH" "$CHROOT$SCRATCH"
cp "$ROOT/scripts/hf_classes_oracle.py" "$SCRATCH/"
rm -f "$SCRATCH/exports.json"
for name in gpt2_tiny mixtral_ds0195; do
  rm -rf "$SCRATCH/$name" && mkdir -p "$SCRATCH/$name"
  cp "$BUILD/tests/work/hf_classes/${name}_np1/"*.json "$BUILD/tests/work/hf_classes/${name}_np1/"*.safetensors "$SCRATCH/$name/"
  if [ "$name" = gpt2_tiny ]; then want=$DATA/gpt2_tiny/transformers_logits.json; else want=$DATA/$name/harness_logits.json; fi
  cp "$want" "$SCRATCH/$name.logits.json"
  chroot "$CHROOT" /bin/bash -c ". /opt/hf/hfenv.sh; cd $SCRATCH && python hf_classes_oracle.py check $name $SCRATCH/$name.logits.json $SCRATCH/$name $SCRATCH/exports.json"
done
cp "$SCRATCH/exports.json" "$DATA/exports.json"
umount "$CHROOT$SCRATCH"
rm -rf "$SCRATCH"
echo "wrote $DATA/exports.json"
