"""Why a family the census lists does not build or run here: one line saying what is missing.

The census still tries every family (a new Transformers release may fix one); these lines replace the raw
exception of the ones known not to fit, and ``--debug`` prints the traceback either way.
"""

from __future__ import annotations

__all__ = ["KNOWN_GAPS", "reason_for"]

KNOWN_GAPS: dict[str, str] = {
    "apertus1p5": "its images go through a discrete vision tokenizer, not a patch tower (no input hook yet)",
    # (Only where syncfree does not register the family, Transformers 5.17: elsewhere its family lays the batch out.)
    "glm_image": "an image generator: its processor adds target-image grids per sample, laid out by syncfree only "
                 "where it supports the family (Transformers 5.24)",
    "radio": "a vision backbone with no text side: no image placeholders to fill (no input hook yet)",
}


def reason_for(family: str, exc: BaseException) -> str:
    """The family's known gap, else the exception in one line."""
    if family in KNOWN_GAPS:
        return KNOWN_GAPS[family]
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:240]
