"""``python -m syncfree``: the ``syncfree`` command, for an environment whose scripts folder is not on PATH."""

import sys

from .cli.main import main

sys.exit(main())
