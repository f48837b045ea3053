"""``python -m sentinel.cli``: the ``sentinel`` command without its console script."""

import sys

from sentinel.cli import main

sys.exit(main())
