"""``python -m shardgate.cli``: the ``shardgate`` command."""

import sys

from shardgate.cli.app import main

sys.exit(main())
