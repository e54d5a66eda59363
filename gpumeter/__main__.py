"""``python -m gpumeter``: the same as the ``gpumeter`` command."""

import sys

from gpumeter import main

sys.exit(main())
