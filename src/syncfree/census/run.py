"""The census: every model family of the installed Transformers with the packed vision split, audited.

Families are found by reading the installed modeling sources (``lengths.tolist()``), not from a list.
For each: a tiny random model from the family's own config class, two images of different sizes packed
as its processor packs them (``inputs``), one forward on the emulated device stock and one patched
(full support where syncfree has it, the generic split fix otherwise), the syncs and blocking copies
of each, and whether the outputs are equal. A family that cannot be built or run is listed with the reason (``reasons``).
"""

from __future__ import annotations

import copy
import os
import time
import traceback
from dataclasses import asdict, dataclass, field

import torch

__all__ = ["CensusRow", "discover", "census_family", "run_census", "tiny_model_and_batch", "support_level", "output_of",
           "whole_forward_graph_breaks", "host_ms", "family_batch", "patched_type"]

PATTERN = "lengths.tolist()"


@dataclass
class CensusRow:
    family: str
    status: str  # "ok", "not built", "not run"
    support: str = "none"  # "full", "generic", "none", or "changed" (fully supported, but this release's code differs)
    stock_syncs: int | None = None
    stock_blocking: int | None = None
    patched_syncs: int | None = None
    patched_blocking: int | None = None
    prepared_syncs: int | None = None  # full support only: inputs from syncfree.prepare
    same_outputs: bool | None = None
    # Kernel launches of the forward on the emulated device (aten ops that put a kernel on the stream: views,
    # allocations and copies left out), stock and patched (with inputs from syncfree.prepare where fully supported).
    stock_launches: int | None = None
    patched_launches: int | None = None
    # Graph breaks of the whole forward under torch.compile (torch._dynamo.explain on the host), the same two.
    stock_breaks: int | None = None
    patched_breaks: int | None = None
    # Host milliseconds of one forward of the tiny model on the CPU (median of five, no grad): stock, and patched with
    # syncfree.prepare on every call (the plan's host work counted in).
    stock_ms: float | None = None
    patched_ms: float | None = None
    # Where the patched forward's graph breaks are (file:line, then Dynamo's reason), most frequent first.
    break_sites: list[str] = field(default_factory=list)
    left: str = ""  # where the patched forward still syncs most (file:line), if anywhere
    reason: str = ""
    seconds: float = 0.0


def discover() -> list[str]:
    """Model types whose installed modeling code has the packed vision split, and the fully supported ones whose
    tower is another family's (GLM-4.6V runs GLM-4.1V's), sorted."""
    import transformers

    from ..families import FAMILIES

    root = os.path.join(os.path.dirname(transformers.__file__), "models")
    found = []
    for family in sorted(os.listdir(root)):
        path = os.path.join(root, family, f"modeling_{family}.py")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                if PATTERN in f.read() or family in FAMILIES:
                    found.append(family)
    return found


def patched_type(family: str) -> str:
    """The model type syncfree patches for a census family (a Transformers model folder): its own, or an Omni model's
    thinker's."""
    from ..families import FAMILIES

    return family if family in FAMILIES else f"{family}_thinker"


def support_level(family: str) -> str:
    """"full" (in syncfree's family table), "generic" (a class of the family's modeling code holds the packed
    split as syncfree fixes it) or "none" -- read from the installed source, whether or not a model builds."""
    import importlib

    from ..families import FAMILIES
    from ..rewrite.generic import has_split

    if patched_type(family) in FAMILIES:  # (an Omni model: syncfree patches its thinker)
        return "full"
    try:
        module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    except Exception:
        return "none"
    classes = [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__]
    return "generic" if any(has_split(c.__dict__.get("forward")) for c in classes) else "none"


def _where_left(report) -> str:
    lines: dict[str, int] = {}
    for event in report.syncs:
        lines[event.line] = lines.get(event.line, 0) + 1
    if not lines:
        return ""
    line, count = max(lines.items(), key=lambda kv: kv[1])
    return f"{count} at {line}"


def output_of(out) -> torch.Tensor:
    """The forward's main tensor: logits, else the last hidden state, else the first output."""
    for name in ("logits", "last_hidden_state"):
        value = getattr(out, name, None)
        if isinstance(value, torch.Tensor):
            return value
    return out[0]


def _audited(model, batch: dict, prepared: bool = False):
    from ..audit import audit
    from ..inputs import batch_to
    from ..prepare import prepare

    inputs = prepare(batch, "cuda", model) if prepared else batch_to(batch, "cuda")
    with audit() as report, torch.no_grad():
        out = output_of(model(**inputs))
    return report, out.cpu()  # after the audit: reading the result back is not the forward's doing


# Omni families: no auto class builds them from a config, and their forward takes audio; the census
# runs their thinker (what syncfree patches), as syncfree's tiny preset builds it, on an Omni batch.
OMNI_TINY = {"qwen3_omni_moe": "qwen3-omni-tiny", "qwen2_5_omni": "qwen2.5-omni-tiny"}


def family_batch(model) -> dict | None:
    """A fully supported family's own processor layout (its pixels, markers, token types) with the census's two
    images of different sizes; None for the others (they get ``census_batch``'s)."""
    from ..families import FAMILIES
    from ..inputs import Image, Text, asr_layout, is_audio_only, processor_batch
    from ..plan.spec import ModelSpec

    if model.config.model_type not in FAMILIES:
        return None
    if is_audio_only(model.config):  # (Qwen3-ASR: no images; its processor's clips of different lengths instead)
        return processor_batch(model.config, asr_layout("mixed"))
    vc = model.config.vision_config
    # Sides are multiples of the patch times the plan's merge (MiniCPM-V 4.6's "16x": 4; VideoLLaMA3's merges come per
    # item: its config's, where it names one; Kimi-K2.5's: its merge kernel).
    merge = max(getattr(vc, "spatial_merge_size", 1) or 1, ModelSpec.from_config(model.config).spatial_merge_size)
    unit = vc.patch_size * merge
    return processor_batch(model.config, [[Text(6), Image(2 * unit, 2 * unit), Text(6), Image(4 * unit, 4 * unit),
                                           Text(6)]])


def _omni_thinker(family: str):
    from ..inputs import omni_layout, processor_batch
    from ..presets import build_model

    model = build_model(OMNI_TINY[family])
    unit = model.config.vision_config.patch_size * model.config.vision_config.spatial_merge_size
    return model, processor_batch(model.config, omni_layout("mixed", unit=unit))


def _failed(row: CensusRow, exc: BaseException, debug: bool) -> None:
    from .reasons import reason_for

    row.reason = reason_for(row.family, exc)
    if debug or os.environ.get("SYNCFREE_DEBUG"):
        traceback.print_exc()


def tiny_model_and_batch(family: str) -> tuple[torch.nn.Module, dict]:
    """The census's tiny model of ``family`` (an Omni family's thinker) and its batch of two images."""
    from .inputs import census_batch
    from .tiny import build_tiny

    model, batch = _omni_thinker(family) if family in OMNI_TINY else (build_tiny(family), None)
    return model, batch or family_batch(model) or census_batch(model)


def whole_forward_graph_breaks(model, batch: dict, prepared: bool = False) -> tuple[int, list[str]]:
    """Graph breaks of ``model``'s whole forward on ``batch`` (inputs from ``syncfree.prepare`` if ``prepared``), as
    ``torch._dynamo.explain`` counts them on the host, and where they are: ``"file:line: reason"``, most frequent
    first (a count in front where a site breaks more than once). A copy is traced: Dynamo keeps references to what it
    traced."""
    from ..prepare import prepare

    inputs = prepare(batch, "cpu", model) if prepared else dict(batch)
    traced = copy.deepcopy(model)
    try:
        with torch.no_grad():
            explained = torch._dynamo.explain(traced)(**inputs)
        sites: dict[str, int] = {}
        for reason in explained.break_reasons:
            frame = reason.user_stack[-1] if reason.user_stack else None
            where = f"{_short_path(frame.filename)}:{frame.lineno}" if frame else "?"
            site = f"{where}: {str(reason.reason).strip().splitlines()[0][:120]}"
            sites[site] = sites.get(site, 0) + 1
        ranked = sorted(sites.items(), key=lambda kv: -kv[1])
        return explained.graph_break_count, [f"{n}x {site}" if n > 1 else site for site, n in ranked]
    finally:
        del traced
        torch._dynamo.reset()


def host_ms(model, batch: dict, prepared: bool = False, repeats: int = 5) -> float:
    """Median host milliseconds of ``model``'s forward on ``batch`` on the CPU (``prepared``: ``syncfree.prepare``
    on every call, timed with it), after one untimed call."""
    from ..prepare import prepare

    def once() -> float:
        start = time.perf_counter()
        with torch.no_grad():
            model(**(prepare(batch, "cpu", model) if prepared else batch))
        return (time.perf_counter() - start) * 1e3

    once()
    times = sorted(once() for _ in range(repeats))
    return round(times[len(times) // 2], 2)


def _short_path(path: str) -> str:
    """A source path from the package down (transformers/..., syncfree/...)."""
    for root in ("transformers", "syncfree", "torch"):
        marker = f"/{root}/"
        if marker in path:
            return root + "/" + path.rsplit(marker, 1)[1]
    return path


def census_family(family: str, debug: bool = False, graph_breaks: bool = True) -> CensusRow:
    """One row of the census (never raises: a failure is the row's reason; ``debug`` prints its traceback).
    ``graph_breaks``: also count the whole forward's graph breaks (the slowest part of a row)."""
    from ..audit import emulate_cuda
    from ..patching import patch, refusal_for

    start = time.perf_counter()
    row = CensusRow(family, "not built", support=support_level(family))
    try:
        stock, batch = tiny_model_and_batch(family)
    except Exception as exc:  # a family the generic shrinker or input builder does not fit
        _failed(row, exc, debug)
        row.seconds = time.perf_counter() - start
        return row
    row.status = "not run"
    refused = refusal_for(stock) if row.support == "full" else None
    if refused is not None:  # (a release changed its code: stock only, and the row says which function)
        row.support, row.reason = "changed", f"left stock: {refused.where} changed ({refused.problem})"[:240]
    try:
        patched = patch(copy.deepcopy(stock)) if row.support in ("full", "generic") else None
    except ValueError as exc:
        patched, row.reason = None, f"{type(exc).__name__}: {exc}".replace("\n", " ")[:240]
    try:
        with emulate_cuda():
            stock.to("cuda")
            report, expected = _audited(stock, batch)
            row.stock_syncs, row.stock_blocking = len(report.syncs), len(report.blocking_copies)
            row.stock_launches = report.launches
            if patched is not None:
                patched.to("cuda")
                report, got = _audited(patched, batch)
                row.patched_syncs, row.patched_blocking = len(report.syncs), len(report.blocking_copies)
                row.same_outputs = bool(got.shape == expected.shape and torch.equal(got, expected))
                if row.support == "full":
                    report, _ = _audited(patched, batch, prepared=True)
                    row.prepared_syncs = len(report.syncs)
                row.patched_launches = report.launches
                row.left = _where_left(report)
            stock.to("cpu")
            if patched is not None:
                patched.to("cpu")
        row.stock_ms = host_ms(stock, batch)
        if patched is not None:
            row.patched_ms = host_ms(patched, batch, prepared=row.support == "full")
        if graph_breaks:
            row.stock_breaks = whole_forward_graph_breaks(stock, batch)[0]
            if patched is not None:
                row.patched_breaks, row.break_sites = whole_forward_graph_breaks(patched, batch,
                                                                                 prepared=row.support == "full")
        row.status = "ok"
    except Exception as exc:
        _failed(row, exc, debug)
    row.seconds = time.perf_counter() - start
    return row


def run_census(families: list[str] | None = None, progress=None, debug: bool = False,
               graph_breaks: bool = True) -> list[CensusRow]:
    rows = []
    chosen = families or discover()
    for i, family in enumerate(chosen, 1):
        if progress:
            progress(f"[{i}/{len(chosen)}] {family}")
        rows.append(census_family(family, debug, graph_breaks))
    return rows


def as_dicts(rows: list[CensusRow]) -> list[dict]:
    return [asdict(r) for r in rows]
