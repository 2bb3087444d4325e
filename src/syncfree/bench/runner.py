"""Run the matrix: stock vs patched, side by side in one process, for every model/scenario/scope/attention/compile.

Latency: one warm-up, then up to ``repeats`` timed runs (fewer when one forward is slow, so a
big input does not eat the whole budget; on the CPU a forward longer than the budget is taken
as its own measurement); CUDA events on the GPU, ``perf_counter`` on the CPU. The full scope
asks for the last position's logits only, as ``generate()``'s prefill does.
The patched time includes ``syncfree.prepare`` (it starts from the processor's CPU tensors, as
stock does). Host syncs come from ``syncfree.audit`` (the real device on a GPU; on a CPU, the
emulated one, run on the same layout at its smallest pixel size, since the syncs depend on the
layout and not on the pixel count). Graph breaks come from ``torch._dynamo.explain`` of the
vision tower. Every ratio is patched / stock within this one run.

The ``train`` scope times one training step: forward with labels (the causal-LM loss), backward, an
optimizer step and ``zero_grad``. The optimizer is SGD with learning rate 0: stateless and leaving
the weights as built, so repeats time the same step and memory stays that of the step itself (AdamW's
update syncs no more: see ``syncfree audit --train``). Its syncs are also counted by phase.
"""

from __future__ import annotations

import contextlib
import inspect
import statistics
import time
from dataclasses import dataclass, field

import torch

from ..audit import audit, emulate_cuda
from ..compare.towers import tower_call
from ..compare.train import labels_for
from ..compare.varlen import VARLEN, use_torch_varlen
from ..inputs import batch_to, processor_batch
from ..patching import patch, refusal_for, unpatch
from ..plan.errors import InputsNotTaken
from ..plan.spec import layout_of
from ..prepare import plan_of, prepare
from ..presets import PRESETS, build_model, vision_tower_of
from .scenarios import SCENARIOS

__all__ = ["BenchConfig", "MatrixRun", "run_matrix"]


@dataclass
class BenchConfig:
    models: tuple[str, ...]
    scenarios: tuple[str, ...] = tuple(SCENARIOS)
    scopes: tuple[str, ...] = ("vision", "full")
    attns: tuple[str, ...] = ("sdpa",)
    compile: tuple[bool, ...] = (False,)
    compile_mode: str | None = None  # torch.compile's mode for the compiled cells ("reduce-overhead": CUDA graphs)
    device: str = "cpu"
    repeats: int = 5
    budget_s: float = 20.0  # timed seconds per variant before the repeats are cut
    scale: float = 1.0
    max_frames: int | None = None
    text_layers: int = 2
    dtype: str = "float32"
    graph_breaks: bool = True
    deadline_s: float | None = None  # start no new scenario after this many seconds
    keep_going: bool = False  # record a failing scenario and go on, instead of stopping
    vision_attention: str = "split"  # the patched model's vision attention backend (rewrite/attention.py)
    extra: dict = field(default_factory=dict)


def _use(model, variant: str, vision_attention: str = "split") -> None:
    """Stock or patched (with the configured vision attention backend), on the same model object."""
    if variant == "patched":
        patch(model, vision_attention=vision_attention)
    else:
        unpatch(model)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_calls(fn, device: str, repeats: int, budget_s: float, compiled: bool = False) -> list[float]:
    """Milliseconds per call: one warm-up, then timed calls within the budget."""
    start = time.perf_counter()
    fn()
    _sync(device)
    first = time.perf_counter() - start
    if device == "cpu" and first > budget_s and not compiled:  # (a compiled warm-up is mostly compiling)
        return [first * 1e3]  # a forward this long on the CPU is its own measurement: no warm-up effect left
    n = max(1, min(repeats, int(budget_s / max(first, 1e-6))))
    out = []
    for _ in range(n):
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            out.append(begin.elapsed_time(end))
        else:
            start = time.perf_counter()
            fn()
            out.append((time.perf_counter() - start) * 1e3)
    return out


def _runner(model, batch: dict, scope: str, variant: str, device: str, compiled: bool, mode: str | None = None):
    """A zero-argument callable running one forward of ``variant`` from host tensors in ``batch``."""
    visual = vision_tower_of(model)
    forward = model
    if compiled and scope == "vision":
        visual = torch.compile(visual, fullgraph=variant == "patched", dynamic=False, mode=mode)
    elif compiled:
        # The whole model: stock as Transformers compiles it (fullgraph=False); patched, with prepared inputs, as one
        # graph where the family's forward traces whole (else as stock's, breaks and all).
        forward = torch.compile(model, fullgraph=variant == "patched" and traces_whole(model), dynamic=False, mode=mode)

    keep_last = "logits_to_keep" in inspect.signature(model.forward).parameters

    if scope == "train":
        labels = labels_for(batch)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)

    def run():
        if variant == "patched":
            kwargs = prepare(batch, device, model)
        else:
            kwargs = batch_to(batch, device)
        if scope == "train":
            kwargs["labels"] = labels.to(device, non_blocking=variant == "patched")  # (prepare's copies are pinned)
            with torch.enable_grad():
                forward(**kwargs).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        elif scope == "vision":
            plan = plan_of(kwargs)
            for pixels, grid, kind in (("pixel_values", "image_grid_thw", "image"),
                                       ("pixel_values_videos", "video_grid_thw", "video")):
                if pixels in kwargs:
                    tower_pixels, tower_grid, extra = tower_call(model, kind, kwargs[pixels], kwargs[grid], plan,
                                                                 images_per_sample=kwargs.get("images_per_sample"))
                    visual(tower_pixels, grid_thw=tower_grid, **extra)
        elif keep_last:
            forward(**kwargs, logits_to_keep=1)  # as generate()'s prefill: logits of the last position only
        else:  # (Omni thinkers take no logits_to_keep)
            forward(**kwargs)

    return run


def traces_whole(model) -> bool:
    """Whether ``model``'s family traces its whole prepared forward as one graph (``Layout.one_graph``)."""
    layout = layout_of(getattr(model.config, "model_type", ""))
    return layout is not None and layout.one_graph


def _audits(model, batch: dict, scopes, device: str, vision_attention: str = "split") -> dict:
    """Syncs and copies of one forward per (scope, variant), on the real device or the emulated one.

    One emulated session per scenario: moving a large model onto the emulated device costs a copy.
    """
    gpu = device == "cuda"
    out = {}
    with contextlib.nullcontext() if gpu else emulate_cuda():
        if not gpu:
            model.to("cuda")
        try:
            for scope in scopes:
                model.train(scope == "train")
                for variant in ("stock", "patched"):
                    _use(model, variant, vision_attention)
                    run = _runner(model, batch, scope, variant, "cuda", compiled=False)
                    if gpu:
                        run()  # warm-up: first calls set up kernels and caches, which is not the forward's doing
                        torch.cuda.synchronize()
                    with audit() as report:
                        run()
                    s = report.summary()
                    out[scope, variant] = {"syncs": s["syncs"], "blocking_copies": s["blocking_copies"],
                                           "h2d": s["h2d"], "d2h": s["d2h"], "launches": s["launches"],
                                           "sync_lines": sorted({e.line for e in report.syncs})}
                    if scope == "train":
                        out[scope, variant]["syncs_by_phase"] = {p: n["syncs"] for p, n in report.by_phase().items()}
        finally:
            unpatch(model)
            model.eval()
            if not gpu:
                model.to("cpu")
    return out


def _graph_breaks(model, batch: dict, variant: str, device: str) -> int | None:
    if variant == "patched":
        kwargs = prepare(batch, device, model)
    else:
        kwargs = batch_to(batch, device)
    plan = plan_of(kwargs)
    if "pixel_values" not in kwargs:
        return None
    pixels, grid, extra = tower_call(model, "image", kwargs["pixel_values"], kwargs["image_grid_thw"], plan,
                                     images_per_sample=kwargs.get("images_per_sample"))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(vision_tower_of(model))(pixels, grid_thw=grid, **extra)
    return explained.graph_break_count


@dataclass
class MatrixRun:
    """What ``run_matrix`` measured, what failed (with ``keep_going``) and what the deadline left out."""

    records: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    not_run: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # scenarios a family cannot take (stock refuses them too)


def plan_cost(model, batch: dict, repeats: int = 5) -> dict:
    """What the patched variant's plan costs the host: ``prepare(batch)`` time (the minimum of ``repeats``;
    the forward's thread pays it where ``prepare`` runs there) and the bytes its plan uploads."""
    times = []
    for _ in range(repeats + 1):  # (the first: warm-up)
        start = time.perf_counter()
        plan = plan_of(prepare(batch, None, model))
        times.append(time.perf_counter() - start)
    return {"plan_ms": 1e3 * min(times[1:]), "plan_kb": plan.nbytes() / 1024}


def _timed_cells(cfg: BenchConfig) -> list[tuple[str, bool]]:
    """(scope, compiled) pairs timed per scenario: compiled, the vision scope compiles the tower, the others the model."""
    return [(scope, compiled) for scope in cfg.scopes for compiled in cfg.compile]


def _scenario(model, model_name: str, attn: str, scenario_name: str, cfg: BenchConfig, counter, progress,
              pending: list) -> list[dict]:
    """Every (scope, compile, variant) record of one scenario on one model."""
    config = model.config
    unit = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    pad = PRESETS[model_name].pad_token_id if model_name in PRESETS else None
    scenario = SCENARIOS[scenario_name]
    batch = processor_batch(config, scenario.samples(unit, cfg.scale, cfg.max_frames), pad_token_id=pad)
    small = batch if cfg.device == "cuda" else processor_batch(config, scenario.smallest(unit), pad_token_id=pad)
    with torch.no_grad():
        audits = _audits(model, small, cfg.scopes, cfg.device, cfg.vision_attention)
    cost = plan_cost(model, batch)
    records = []
    for scope, compiled in _timed_cells(cfg):
        if scope == "vision" and not scenario.pixels:
            continue  # an audio-only scenario: no vision tower runs (the full scope times the audio encoder)
        model.train(scope == "train")
        for variant in ("stock", "patched"):
            _use(model, variant, cfg.vision_attention)
            if progress:
                progress(f"[{next(counter)}/{counter.total}] {model_name} {scenario_name} {scope} {attn}"
                         f"{' compiled' if compiled else ''} {variant}")
            with torch.no_grad():
                times = time_calls(_runner(model, batch, scope, variant, cfg.device, compiled, cfg.compile_mode),
                                   cfg.device,
                              cfg.repeats, cfg.budget_s, compiled)
                record = {
                    "model": model_name, "scenario": scenario_name, "scope": scope, "attn": attn,
                    "compiled": compiled, "device": cfg.device, "variant": variant,
                    "latency_ms": statistics.median(times), "latency_min_ms": min(times),
                    "latency_max_ms": max(times), "repeats": len(times),
                    "tokens": int(batch["input_ids"].numel()),
                    "patches": int(sum(batch[k].shape[0] for k in ("pixel_values", "pixel_values_videos")
                                       if k in batch)),
                }
                if not compiled:
                    record.update(audits[scope, variant])
                if variant == "patched":
                    record.update(cost)
                if cfg.device == "cuda":
                    from .gpu_metrics import profile_forward

                    torch.cuda.reset_peak_memory_stats()
                    record["gpu"] = profile_forward(_runner(model, batch, scope, variant, "cuda", compiled,
                                                            cfg.compile_mode))
                    record["peak_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
                if cfg.graph_breaks and scope == "vision" and not compiled:
                    pending.append((record, small, variant))
            records.append(record)
    unpatch(model)
    model.eval()
    return records


class _Counter:
    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0

    def __next__(self) -> int:
        self.done += 1
        return self.done


def _failure(model_name: str, attn: str, scenario: str | None, exc: BaseException) -> dict:
    import traceback

    return {"model": model_name, "attn": attn, "scenario": scenario, "error": f"{type(exc).__name__}: {exc}",
            "traceback": "".join(traceback.format_exception(exc))[-4000:]}


def step_count(cfg: BenchConfig) -> int:
    """How many timed (model, attention, scenario, scope, compile, variant) steps the matrix has: its progress total."""
    return len(cfg.models) * len(cfg.attns) * 2 * sum(1 for s in cfg.scenarios for scope, _ in _timed_cells(cfg)
                                                      if scope != "vision" or SCENARIOS[s].pixels)


_clock = time.perf_counter  # the deadline's clock (a test steps it by hand)


def run_matrix(cfg: BenchConfig, progress=None, on_update=None) -> MatrixRun:
    """Run every cell of the matrix, stock and patched side by side.

    ``cfg.deadline_s`` stops starting new scenarios once that many seconds have passed (the
    ones left are listed in ``not_run``); ``cfg.keep_going`` records a failing scenario in
    ``errors`` and goes on. ``on_update(run)`` is called after each scenario, so a caller can
    write partial results that survive being stopped.
    """
    start = _clock()
    run = MatrixRun()
    # Attention outermost: if a deadline cuts the run, the first implementation has every model.
    cells = [(m, a) for a in cfg.attns for m in cfg.models]
    counter = _Counter(step_count(cfg))
    for model_name, attn in cells:
        if cfg.deadline_s is not None and _clock() - start > cfg.deadline_s:
            run.not_run += [{"model": model_name, "attn": attn, "scenario": s} for s in cfg.scenarios]
            continue
        try:
            model = build_model(model_name, attn="sdpa" if attn == VARLEN else attn, text_layers=cfg.text_layers,
                                dtype=getattr(torch, cfg.dtype), device=cfg.device)
            if attn == VARLEN:
                use_torch_varlen(model)  # the vision tower only; the text model stays on SDPA
        except Exception as exc:
            if not cfg.keep_going:
                raise
            run.errors.append(_failure(model_name, attn, None, exc))
            continue
        refused = refusal_for(model)
        if refused is not None:  # (a family this release changed: a row that says why, for each scenario)
            run.skipped += [{"model": model_name, "attn": attn, "scenario": s,
                             "why": f"syncfree leaves it stock on this Transformers release: {refused.where} changed "
                                    "(`syncfree doctor` says how)"} for s in cfg.scenarios]
            del model
            continue
        pending: list = []
        for scenario_name in cfg.scenarios:
            if cfg.deadline_s is not None and _clock() - start > cfg.deadline_s:
                run.not_run.append({"model": model_name, "attn": attn, "scenario": scenario_name})
                continue
            measured: list = []  # graph breaks to count, kept only if the whole scenario ran
            try:
                run.records += _scenario(model, model_name, attn, scenario_name, cfg, counter, progress, measured)
                pending += measured
            except InputsNotTaken as exc:
                unpatch(model)
                run.skipped.append({"model": model_name, "attn": attn, "scenario": scenario_name, "why": str(exc)})
            except Exception as exc:
                if not cfg.keep_going:
                    raise
                unpatch(model)
                run.errors.append(_failure(model_name, attn, scenario_name, exc))
                if cfg.device == "cuda":
                    torch.cuda.empty_cache()
            if on_update:
                on_update(run)
        # Last, as Dynamo keeps weak references to the parameters, after which model.to() cannot swap them.
        breaks: dict = {}
        for record, small, variant in pending:
            key = (record["scenario"], variant)
            if key not in breaks:
                _use(model, variant, cfg.vision_attention)
                try:
                    breaks[key] = _graph_breaks(model, small, variant, cfg.device)
                except Exception as exc:
                    if not cfg.keep_going:
                        raise
                    run.errors.append(_failure(model_name, attn, f"{record['scenario']} (graph breaks)", exc))
                    breaks[key] = None
            record["graph_breaks"] = breaks[key]
        unpatch(model)
        del model
        if on_update:
            on_update(run)
    return run
