import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))  # oracle/conformance importable by rank processes too

os.environ.setdefault("RESHARD_TIMEOUT", "120")

# DTensor in torch ranks writes torch's compile cache under /tmp/torchinductor_<user>; the
# tests' ranks write theirs into a directory of the run, removed when the run ends.
_INDUCTOR = tempfile.mkdtemp(prefix="reshard-tests-inductor-")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", _INDUCTOR)


def pytest_unconfigure(config):
    shutil.rmtree(_INDUCTOR, ignore_errors=True)
