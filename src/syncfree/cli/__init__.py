"""The ``syncfree`` command: ``demo``, ``audit``, ``bench``, ``census`` (``main``), and how it reports errors."""

from .main import main

__all__ = ["main"]
