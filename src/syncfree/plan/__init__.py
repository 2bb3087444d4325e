"""Host planning: what a forward derives from its small control tensors, computed on the host once
(``batch.draft_plan`` / ``finish_plan``: vision, audio and rope pieces; ``rope_host`` in NumPy), validated
(``validate``), moved without a wait (``tensors``), completed on the device where it grows with patches
(``vision_tables``), and found again at forward time (``active``). Imports nothing of syncfree above it."""
