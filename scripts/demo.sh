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
echo
echo "== mpirun -np 2 ucp-convert $sample -o $build/demo/hdf5 --format hdf5   (the HDF5 store: one atoms.h5)"
mpirun --oversubscribe -np 2 "$bin/ucp-convert" "$sample" -o "$build/demo/hdf5" --format hdf5 --force
"$bin/ucp-inspect" "$build/demo/hdf5" --verify | tail -2
if command -v h5ls > /dev/null; then h5ls -r "$build/demo/hdf5/atoms.h5" | head -12; fi
echo
echo "== ucp-convert --from-atomic $build/demo/hdf5 --format pt -o $build/demo/back/universal   (byte-identical .pt files)"
"$bin/ucp-convert" --from-atomic "$build/demo/hdf5" --format pt -o "$build/demo/back/universal" --force
diff -r "$out/zero" "$build/demo/back/universal/zero" && echo "zero/ identical to the direct conversion's"
