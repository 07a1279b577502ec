"""``python -m opruntime.tools``: the ``opruntime`` command."""

import sys

from .cli import main

sys.exit(main())
