#!/usr/bin/env bash
# Runs ucp on the bundled sample checkpoint: what it holds, as a table and as JSON.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/apps"
sample="$root/tests/data/sample_llama_tp2_pp2_dp2_bf16"
echo "== ucp-inspect $sample"
"$bin/ucp-inspect" "$sample"
echo
echo "== ucp-inspect --json (degrees and the first parameter)"
"$bin/ucp-inspect" "$sample" --json | /usr/bin/python3 -c \
  'import json,sys; r=json.load(sys.stdin); print(json.dumps({"degrees": r["degrees"], "params": r["params"][:1]}, indent=1))'
