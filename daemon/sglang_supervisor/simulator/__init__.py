"""sglang-sim: a stand-in for SGLang's `launch_server` on machines without a GPU.

It takes SGLang's command line, prints the real engine's log sequence (per emulated version),
runs one child process per TP rank plus a detokenizer, serves SGLang's HTTP API with tokens paced
by a pure throughput model, and injects faults on request (`--sim-fault`, `SGLANG_SIM_FAULTS`).
"""
