"""``python -m opruntime.tools``: the ``opruntime`` command (as ``python -m opruntime``)."""

import sys

from .cli import main

sys.exit(main())
