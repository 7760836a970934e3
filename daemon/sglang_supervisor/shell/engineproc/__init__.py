"""The engine's process and its output: spawn, stop and reap the process family, pump its pipes, the
port, the caches and the API key file it is handed."""
