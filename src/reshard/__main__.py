"""``python -m reshard`` is the ``reshard`` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
