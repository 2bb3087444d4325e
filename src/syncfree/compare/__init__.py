"""Stock against patched on one model: the forward and training-step audits behind ``syncfree audit``
(``forward``, ``train``), shared by the ``bench`` and ``census`` tools; the command-line checks they share
(``checks``), progress lines, and the ``--attn varlen`` attention function."""
