"""``syncfree bench``: stock vs patched, side by side in one run, over the scenario matrix."""

from ..compare.varlen import VARLEN, use_torch_varlen
from .results import footnotes, pairs, table, write_results
from .runner import BenchConfig, MatrixRun, run_matrix
from .scenarios import MODELS, QUICK_MODELS, SCENARIOS, Scenario

__all__ = ["BenchConfig", "MatrixRun", "run_matrix", "pairs", "table", "footnotes", "write_results", "SCENARIOS", "Scenario",
           "MODELS", "QUICK_MODELS", "VARLEN", "use_torch_varlen"]
