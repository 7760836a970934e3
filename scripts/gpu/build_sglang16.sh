#!/usr/bin/env bash
# The second real release for gpu-e2e's `canary` scenario: SGLang 0.5.16's package alone (it needs the
# same sglang-kernel 0.4.5, torch 2.11 and transformers 5.12.1 as the 0.5.17 overlay, which provides
# them), pruned as build_overlay.sh prunes 0.5.17. Runs on a CPU machine with PyPI access.
# Usage, in the checkout: scripts/gpu/build_sglang16.sh .sgl16   (about 6 MB; carry .sgl16)
set -euo pipefail
D=${1:-.sgl16}
mkdir -p "$D"; D=$(cd "$D" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 -d "$tmp" sglang==0.5.16
mkdir "$tmp/site16" && (cd "$tmp/site16" && python3 -m zipfile -e "$tmp"/sglang-0.5.16-*.whl .)
cd "$tmp/site16"
rm -f sglang/srt/server/_core*.so sglang/srt/grpc/_core*.so sglang/srt/multimodal/_core*.so
rm -rf bin; find . -name __pycache__ -prune -exec rm -rf {} +
cd "$tmp" && tar -cJf "$D/sglang16.tar.xz" site16 && ls -l "$D/sglang16.tar.xz"
