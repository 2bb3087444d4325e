"""``syncfree census``: every Transformers model family with the packed vision split, stock vs patched."""

from .run import CensusRow, census_family, discover, run_census

__all__ = ["CensusRow", "census_family", "discover", "run_census"]
