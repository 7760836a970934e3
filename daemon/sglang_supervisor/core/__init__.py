"""Pure decisions over plain data: no processes, sockets, clocks or files.

tests/unit/test_architecture.py keeps it so."""
