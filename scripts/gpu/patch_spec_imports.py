# Copied from the team notes (tools/sglang-gpu/patch_spec_imports.py, 2026-12-01); idempotent here.
"""Guard the lazy DSA / DeepSeek-V4 / FlashMLA imports in sglang 0.5.17 eagle_worker_v2._capture_cuda_graphs.
They only extend an isinstance() list for the draft-extend graph check; dsa_backend does a bare `import deep_gemm`
that the pruned overlay lacks. Usage: python3 patch_spec_imports.py SITE_DIR"""
import sys

p = sys.argv[1] + "/sglang/srt/speculative/eagle_worker_v2.py"
L = open(p).read().split("\n")
if any("_specpatch_e" in l for l in L):
    print(f"already patched: {p}")
    sys.exit(0)
s = next(i for i, l in enumerate(L) if l == "        if _is_cuda or _is_musa:" and "DSA is CUDA-only" in L[i + 1])
e = next(i for i in range(s, len(L)) if L[i].strip() == "graph_supported_backend_types.append(FlashMLABackend)")
new = (["        try:"] + ["    " + l if l else l for l in L[s:e + 1]] +
       ["        except Exception as _specpatch_e:",
        "            print(f'[specpatch] skipped DSA/DSv4/FlashMLA backend-type imports: {_specpatch_e!r}', flush=True)"])
L[s:e + 1] = new
open(p, "w").write("\n".join(L))
print(f"patched {p} lines {s + 1}-{e + 1}")
