"""``python -m shardgate.cli``: the ``shardgate`` command."""

import sys

from shardgate.cli import main

sys.exit(main())
