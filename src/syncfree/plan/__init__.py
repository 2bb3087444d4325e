"""Host planning: what a forward derives from its small control tensors, computed on the host once
(``batch.build_plan``: vision, audio and rope pieces), validated (``validate``), moved without a wait
(``tensors``), and found again at forward time (``active``). Imports nothing of syncfree above it."""
