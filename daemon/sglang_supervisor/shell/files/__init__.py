"""Files on disk: the configuration and the files it names, the state directory's memory, and which
installed code a process runs."""
