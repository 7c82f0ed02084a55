"""What every test shares: the timeout ranks run under and a compile cache of the run's own.
Helpers are the package ``tests.helpers`` (the repository root is on the path: pyproject's
``pythonpath``), importable by rank processes too."""

import os
import shutil
import tempfile

os.environ.setdefault("RESHARD_TIMEOUT", "120")

# DTensor in torch ranks writes torch's compile cache under /tmp/torchinductor_<user>; the
# tests' ranks write theirs into a directory of the run, removed when the run ends.
_INDUCTOR = tempfile.mkdtemp(prefix="reshard-tests-inductor-")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", _INDUCTOR)


def pytest_unconfigure(config):
    shutil.rmtree(_INDUCTOR, ignore_errors=True)
