"""``python -m tito.cli``: the ``tito`` command."""

import sys

from tito.cli import main

sys.exit(main())
