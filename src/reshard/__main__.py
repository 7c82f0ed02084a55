"""``python -m reshard`` is the ``reshard`` command."""

import sys

from .cli import main

sys.exit(main())
