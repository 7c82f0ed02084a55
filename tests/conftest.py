import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # oracle/conformance importable by rank processes too

os.environ.setdefault("RESHARD_TIMEOUT", "120")
