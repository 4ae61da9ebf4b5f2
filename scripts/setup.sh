#!/usr/bin/env bash
# One command on a fresh Debian machine: install what ucp needs, build it, and run the main job on
# the bundled sample checkpoint (Llama-style model saved with TP=2 x PP=2 x DP=2, bf16, ZeRO-1).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build.sh"
bash "$root/scripts/demo.sh"
