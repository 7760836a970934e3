"""sglang-supervisor: keeps a tuned SGLang server fast and alive under systemd."""

__version__ = "0.1.0"
