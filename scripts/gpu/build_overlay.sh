#!/usr/bin/env bash
# Copied from the team's reference tool (tools/sglang-gpu/build_overlay.sh, 2026-11-29) so the project
# builds its GPU-run payload from its own files. Usage, in the checkout: scripts/gpu/build_overlay.sh .sgl
# Build the minimal SGLang 0.5.17 overlay for the offline H200 (Python 3.12, torch 2.11.0+cu130 already there).
# Runs on a CPU machine with PyPI access. Output: $D/overlay.tar.xz (about 46 MB; measured 2026-11-29),
# which unpacks to $D/../site -> /tmp/site on the device. Put $D in .git/info/exclude and name it in `carry`.
set -euo pipefail
D=${1:-.sgl}
mkdir -p "$D/whl"; rm -rf "$D/site"
P="--python-version 3.12 --implementation cp --only-binary=:all: \
 --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64"
PKGS="sglang==0.5.17 sglang-kernel==0.4.5 flashinfer-python==0.6.15.post1 apache-tvm-ffi==0.1.11 xgrammar==0.2.1
 compressed-tensors==0.20.1 torch-c-dlpack-ext==0.1.5 typing-extensions==4.16.0
 fastapi==0.165.0 starlette==1.10.0 opentelemetry-api==1.45.2 uvicorn==0.54.0 python-multipart==0.0.34
 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
 orjson==3.13.0 msgspec==0.22.0 pyzmq==27.3.0 pybase64==1.5.1 setproctitle==1.3.8 partial-json-parser==0.2.1.1.post7
 openai==2.6.1 jiter==0.19.0 sniffio==1.3.1 distro==1.9.0 gguf==0.19.0 dill==0.4.1 loguru==0.7.3
 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
 soundfile==0.13.1 cffi==2.1.1 pycparser==3.12
 ipython==9.18.1 ipython-pygments-lexers==1.1.1 jedi==0.20.1 parso==0.8.7 traitlets==5.16.1 prompt-toolkit==3.0.53
 wcwidth==0.9.4 pexpect==4.9.0 ptyprocess==0.7.0 stack-data==0.6.3 executing==2.3.0 asttokens==3.0.2 pure-eval==0.2.4
 matplotlib-inline==0.2.2
 transformers==5.12.1 tokenizers==0.22.2"
python3 -m pip download -q --no-deps $P -d "$D/whl" $PKGS          # ~462 MB, 383 MB of it sglang-kernel
python3 -m pip install -q --no-deps --no-index --no-compile --target "$D/site" $P "$D"/whl/*.whl
cd "$D/site"
# Not needed for a dense model on sm_90 with --attention-backend triton (FA3 alone is 1.12 GB unpacked):
rm -f sgl_kernel/flash_ops.abi3.so sgl_kernel/flashmla_ops.abi3.so sgl_kernel/infllm_ops*.so
rm -rf sgl_kernel/sm100 xgrammar/lib bin
rm -f sglang/srt/server/_core*.so sglang/srt/grpc/_core*.so sglang/srt/multimodal/_core*.so   # optional Rust servers
find . -name __pycache__ -prune -exec rm -rf {} +
cd ..
tar -cJf overlay.tar.xz site && ls -l overlay.tar.xz
rm -rf whl site          # keep only the tarball (must stay < ~60 MiB with everything else carried)
