# Put first on PYTHONPATH, this stands in for torch so that `import torch` fails: the MPI
# engine's numpy-only conformance run proves reshard never needs torch there.
raise ImportError("torch is blocked in this process (tests/no_torch): reshard must work without it")
