"""The names the command line's options offer, as literals: ``syncfree --help`` and ``syncfree COMMAND --help``
must not import torch or Transformers (seconds of start-up), and the registries these names come from do.
``tests/test_cli.py`` checks that each tuple here is its registry's. (The presets, which the families register as the
installed Transformers allows, are listed by ``syncfree presets``.)"""

from __future__ import annotations

__all__ = ["INPUT_KINDS", "VISION_BACKENDS"]

# ``syncfree.inputs.LAYOUT_NAMES`` then ``OMNI_LAYOUT_NAMES``, each once
INPUT_KINDS = ("image", "images", "video", "mixed", "audio", "audio-in-video")
# ``syncfree.rewrite.attention.BACKENDS``
VISION_BACKENDS = ("split", "grouped", "block_diagonal", "varlen", "auto")
