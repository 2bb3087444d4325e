"""The census's tables: which families syncfree supports, and what each still syncs (README.md, docs/families.md)."""

from __future__ import annotations

import re

from .common import WHY_LEFT, bold_zero, display_name, load, reproduce, span, table

__all__ = ["census_rows", "render_device_work", "render_families", "render_support"]


# ---- the census: which families syncfree supports, and what each still syncs -----------------------------
def census_rows() -> list[dict]:
    return load("census.json")["rows"]


def _where_left(left: str) -> str:
    """'4 at transformers/integrations/moe.py:379' -> the file's line and why it syncs."""
    where = re.sub(r"^\d+ at ", "", left)
    why = next((text for path, text in WHY_LEFT.items() if where.startswith(path)), "")
    return f"`{where}`" + (f": {why}" if why else "")


def _support(row: dict) -> str:
    if row["support"] == "changed":
        return "left stock (this release changed its code)"
    return {"full": "full", "generic": "generic fix", "none": "none"}.get(row["support"], row["support"])


def _census_summary(rows: list[dict], meta: dict) -> str:
    count = {level: sum(r["support"] == level for r in rows) for level in ("full", "generic", "none", "changed")}
    ran = sum(r["status"] == "ok" for r in rows)
    changed = f", {count['changed']} left stock (their code changed)" if count["changed"] else ""
    return (f"{len(rows)} families: {count['full']} fully supported, {count['generic']} with the generic fix, "
            f"{count['none']} not supported{changed}; {ran} built and ran (Transformers {meta['transformers']}, "
            f"PyTorch {meta['torch'].split('+')[0]}).\n")


def render_support() -> str:
    """README: the census grouped by support level and what remains with ``prepare``."""
    meta = load("census.json")
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in meta["rows"]:
        if row["status"] != "ok":
            remains = f"not run: {row['reason']}"
        elif row["support"] == "full" and row["prepared_syncs"] == 0:
            remains = "nothing"
        elif row["support"] == "full":
            remains = _where_left(row["left"])
        elif row["support"] == "changed":
            remains = row["reason"]
        else:
            remains = f"stock's other reads: `syncfree patch --report --model {row['family']}` lists them"
        groups.setdefault((_support(row), remains), []).append(row)
    out = []
    rank = {"full": 0, "generic fix": 1, "none": 2}
    for (support, remains), rows in sorted(groups.items(), key=lambda g: (rank.get(g[0][0], 3), -len(g[1]))):
        names = ", ".join(sorted((display_name(r["family"]) for r in rows), key=str.lower))
        ran = [r for r in rows if r["status"] == "ok"]
        if not ran:
            syncs = "—"
        elif support == "full":
            syncs = f"{span(r['stock_syncs'] for r in ran)} → {bold_zero(span(r['prepared_syncs'] for r in ran))}"
        else:
            syncs = f"{span(r['stock_syncs'] for r in ran)} → {span(r['patched_syncs'] for r in ran)}"
        out.append((support, names, syncs, remains))
    head = ("support", "families", "syncs per forward, stock → syncfree", "what remains")
    return table(head, out) + "\n" + _census_summary(meta["rows"], meta)


def render_families() -> str:
    """docs/families.md: one row per family the census found."""
    meta = load("census.json")
    rows = []
    for r in meta["rows"]:
        name = f"{display_name(r['family'])} (`{r['family']}`)"
        if r["status"] != "ok":
            rows.append((name, _support(r), "not run", "", "", "", r["reason"]))
            continue
        prepared = "—" if r["prepared_syncs"] is None else bold_zero(r["prepared_syncs"])
        left = r["reason"] if r["support"] == "changed" else (_where_left(r["left"]) if r["left"] else "")
        rows.append((name, _support(r), f"{r['stock_syncs']} ({r['stock_blocking']})", r["patched_syncs"],
                     prepared, "yes" if r["same_outputs"] else "**no**", left))
    head = ("family", "support", "stock syncs (blocking copies)", "patched", "patched + `prepare`", "outputs equal",
            "what is left")
    return (table(head, rows, "llrrrl") + "\n" + _census_summary(meta["rows"], meta) + reproduce("census.json"))


def _arrow(row: dict, stock: str, patched: str) -> str:
    if row.get(stock) is None:
        return "—"
    after = row.get(patched)
    return f"{row[stock]} → {'—' if after is None else after}"


def render_device_work() -> str:
    """docs/families.md: per fully supported family, the kernel launches, whole-forward graph breaks (and the first
    site left) and host milliseconds of the tiny model's forward, stock → patched with ``prepare``."""
    meta = load("census.json")
    rows = []
    for r in meta["rows"]:
        if r["status"] != "ok" or r["support"] != "full":
            continue
        sites = r.get("break_sites") or []
        first = f"`{sites[0].split(': ', 1)[0]}` ({len(sites)} sites)" if sites else ""
        rows.append((f"{display_name(r['family'])} (`{r['family']}`)", _arrow(r, "stock_launches", "patched_launches"),
                     _arrow(r, "stock_breaks", "patched_breaks"), first, _arrow(r, "stock_ms", "patched_ms")))
    head = ("family", "kernel launches", "graph breaks (whole forward)", "most frequent break left", "host ms")
    return (table(head, rows, "lrrlr") + "\nKernel launches are counted on the emulated device (views, allocations and "
            "copies left out); graph breaks by `torch._dynamo.explain` of the whole forward; host milliseconds are the "
            "median of five CPU forwards, `prepare` included on every patched call. `census.json` lists every break "
            "site of each family (`break_sites`). " + reproduce("census.json"))
