"""``python -m syncfree.cli``: the ``syncfree`` command."""

import sys

from .main import main

sys.exit(main())
