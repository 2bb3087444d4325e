"""``census.png``: syncs per forward for every family that ran, stock / patched / with ``prepare``, one row each,
so the families that still pay stand out without reading the table (needs matplotlib, the ``bench`` extra)."""

from __future__ import annotations

from .run import CensusRow

__all__ = ["plot_census"]


def plot_census(rows: list[CensusRow], path: str, versions: str) -> str | None:
    """Write the plot to ``path`` and return it; None (nothing written) where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in rows if r.status == "ok"]
    if not ran:
        return None
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.28 * len(ran)))
    height = 0.27
    y = range(len(ran))
    bars = (("stock", [r.stock_syncs or 0 for r in ran], "tab:red"),
            ("patched", [r.patched_syncs or 0 for r in ran], "tab:orange"),
            # (a family with the generic fix has no prepared run: no bar)
            ("patched + prepare", [r.prepared_syncs or 0 for r in ran], "tab:green"))
    for i, (label, values, color) in enumerate(bars):
        ax.barh([k + (i - 1) * height for k in y], values, height, label=label, color=color)
    ax.set_yticks(list(y))
    ax.set_yticklabels([f"{r.family} ({r.support})" for r in ran], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("host syncs in one forward (tiny model, fp32, its census batch, emulated device)")
    ax.set_title(f"syncfree census: {versions}", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
