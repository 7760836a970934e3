"""What the supervisor tells the world: Prometheus metrics, structured logs for journald, sd_notify,
and the NVML adapter behind the GPU facts."""
