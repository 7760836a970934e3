"""The scenarios of scripts/gpu/e2e.py, one module each (or per family that shares code): each
exports functions of a Context (context.py) that record their results into its report. Not
installed: e2e.py puts scripts/gpu/ on sys.path, so `import e2e_scenarios` (and seedshape,
warmcache) resolve beside it, on the GPU device's copy of the checkout as here."""
