"""``compile_vision``: a model's vision tower compiled once per patch-count bucket (one static graph each).

How the graphs stay independent of the layout is told in ``syncfree.rewrite.buckets``, which runs them.
"""

from __future__ import annotations

import torch

from .patching import is_patched, patch, stock_function
from .plan.spec import ModelSpec
from .rewrite.attention import check_backend, varlen_available
from .rewrite.buckets import BucketError, default_buckets

__all__ = ["compile_vision", "BucketError"]


def compile_vision(model, buckets: tuple[int, ...] | None = None, *, mode: str | None = None, backend=None,
                   compile: bool = True, attention: str | None = None):
    """Compile ``model``'s vision tower once per patch-count bucket (the model is patched first if needed).

    ``buckets``: increasing patch counts (multiples of ``spatial_merge_size**2``), default
    ``default_buckets``. ``mode`` goes to ``torch.compile`` (default ``"reduce-overhead"`` on CUDA:
    CUDA graphs); ``backend`` too (default inductor). ``compile=False`` runs the same padded static
    path eagerly (for auditing it, or debugging). ``attention`` is the vision attention inside the
    graphs: ``block_diagonal`` by default (``varlen`` on a GPU with PyTorch >= 2.10 in bf16/fp16);
    ``split`` or ``grouped`` give results bit-identical to the unpadded tower but a graph per layout,
    not per bucket. Returns the model.
    """
    if attention is not None:
        check_backend(attention)
    if not is_patched(model):
        patch(model)
    towers = [m for m in model.modules() if hasattr(m, "_syncfree_attention")]
    if not towers:
        raise ValueError("syncfree.compile_vision needs a fully supported model (a vision tower syncfree plans for)")
    for visual in towers:
        if not getattr(getattr(visual.forward, "__func__", visual.forward), "syncfree_buckets_ok", True):
            raise ValueError(f"syncfree.compile_vision does not support {type(visual).__name__} yet (its tower takes "
                             "its grid on the device, or no rotary ids); torch.compile the patched tower itself, "
                             "which compiles whole with inputs from syncfree.prepare")
        if ModelSpec.for_vision_model(visual).tower.segment_class_token:
            raise ValueError(f"syncfree.compile_vision does not support {type(visual).__name__} yet (its tower adds a "
                             "class token to each frame, so a bucket's token count depends on the layout); "
                             "torch.compile the patched tower itself, which compiles whole with inputs from "
                             "syncfree.prepare")
        chosen = tuple(buckets) if buckets is not None else default_buckets(visual)
        unit = visual.config.spatial_merge_size ** 2
        if not chosen or list(chosen) != sorted(set(chosen)) or any(b <= 0 or b % unit for b in chosen):
            raise BucketError(f"buckets must be increasing positive multiples of spatial_merge_size**2 = {unit}, "
                              f"got {chosen}")
        stock = _stock_forward(visual)

        def run(hidden_states, static: dict, extra: dict, visual=visual, stock=stock):
            return stock(visual, hidden_states, None, **static, **extra)

        weight = next(visual.parameters())
        on_gpu = weight.device.type == "cuda"
        if compile:
            options = {"fullgraph": True, "dynamic": False}
            if mode is not None or on_gpu:
                options["mode"] = mode or "reduce-overhead"
            if backend is not None:
                options["backend"] = backend
            run = torch.compile(run, **options)
        visual._syncfree_buckets = chosen
        half = weight.dtype in (torch.bfloat16, torch.float16)
        visual._syncfree_bucket_backend = attention or (
            "varlen" if on_gpu and half and varlen_available() else "block_diagonal")
        visual._syncfree_compiled = run
    return model


def _stock_forward(visual):
    """The stock vision forward (not syncfree's wrapper): the padded static plan is handed to it directly."""
    return stock_function(type(visual), "forward", False)
