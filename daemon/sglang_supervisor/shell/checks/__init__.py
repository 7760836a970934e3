"""Asking the serving engine over HTTP: the probe that gates READY, health checks, the throughput
monitor and the output-fidelity checks."""
