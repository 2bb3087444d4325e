"""``syncfree bench``: stock vs patched, side by side in one run, over the scenario matrix."""

from .results import pairs, table, write_results
from .runner import BenchConfig, run_matrix
from .scenarios import MODELS, QUICK_MODELS, SCENARIOS, Scenario

__all__ = ["BenchConfig", "run_matrix", "pairs", "table", "write_results", "SCENARIOS", "Scenario", "MODELS",
           "QUICK_MODELS"]
