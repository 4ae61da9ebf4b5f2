#!/usr/bin/env bash
# One command on a fresh Debian machine: install what ucp needs, build the tools (without the test
# suite, which needs the real checkpoints of ../shared; scripts/test.sh builds it), and run the main job
# on the bundled sample checkpoint (Llama-style model saved with TP=2 x PP=2 x DP=2, bf16, ZeRO-1).
#
#   bash scripts/setup.sh      BUILD_DIR (default build/) holds the tools: build/apps/ucp-*
set -euo pipefail
case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: bash scripts/setup.sh   (no arguments; BUILD_DIR=... to build elsewhere)" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build.sh" -DUCP_BUILD_TESTS=OFF
bash "$root/scripts/demo.sh"
