#!/usr/bin/env bash
# Runs ucp on the bundled sample checkpoint: what it holds, its conversion to an atomic checkpoint
# with 2 MPI ranks, and a check of every file the conversion wrote.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
bin="$build/apps"
sample="$root/tests/data/sample_llama_tp2_pp2_dp2_bf16"
out="$build/demo/universal"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # harmless when not root
echo "== ucp-inspect $sample"
"$bin/ucp-inspect" "$sample"
echo
echo "== mpirun -np 2 ucp-convert $sample -o $out"
mpirun --oversubscribe -np 2 "$bin/ucp-convert" "$sample" -o "$out" --force
echo
echo "== ucp-inspect $out --verify"
"$bin/ucp-inspect" "$out" --verify
