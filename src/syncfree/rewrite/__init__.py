"""The stock-code rewriter and what it installs: the catalog of line edits (``edits``), the rewriter that
applies them (``rewriter``), the wrappers that find a forward's plan (``wrappers``; a family's own in its folder), the
helpers rewritten code calls (``helpers``), the vision attention backends, and the generic split fix.
Below ``syncfree.families`` (which says what to patch) and above ``syncfree.plan`` (what the wrappers run)."""
