"""Liger-Kernel and syncfree on one Qwen-VL model, applied in either order: both stay in force.

Liger replaces ``<X>ForConditionalGeneration.forward`` with its own forward (``lce_forward``), which passes its
``**kwargs`` on to ``self.model(...)``: the multimodal ``*Model.forward`` that syncfree patches, so a prepared
batch's plan reaches it through Liger's forward. Liger's rotary kernels replace module globals
(``apply_rotary_pos_emb``, ``apply_rotary_pos_emb_vision``; for Qwen2.5-VL it sets
``apply_multimodal_rotary_pos_emb``, a name its modeling module neither defines nor calls), which syncfree's rewritten functions
look up at call time in the same module: Liger's kernels are the ones called, in either order.

Liger's kernels are Triton kernels: on a CPU-only machine only its forward replacement runs (without its fused
loss, which needs a GPU; in eval mode the forward computes logits and the stock loss). On a GPU,
``benchmarks/gpu/liger_syncfree.py`` runs the whole of it.

    python examples/liger_with_syncfree.py [qwen3-vl-tiny | qwen2.5-vl-tiny]
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import sys

import torch

import syncfree
from syncfree.compare.train import labels_for
from syncfree.inputs import build_inputs, named_layout
from syncfree.presets import PRESETS, build_model, load_config

# model_type -> (Liger's apply function, Liger's forward module, Transformers' modeling module)
LIGER = {
    "qwen3_vl": ("apply_liger_kernel_to_qwen3_vl", "liger_kernel.transformers.model.qwen3_vl",
                 "transformers.models.qwen3_vl.modeling_qwen3_vl"),
    "qwen2_5_vl": ("apply_liger_kernel_to_qwen2_5_vl", "liger_kernel.transformers.model.qwen2_5_vl",
                   "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl"),
}
_ROPE_GLOBALS = ("apply_rotary_pos_emb", "apply_rotary_pos_emb_vision", "apply_multimodal_rotary_pos_emb")


def liger_unavailable(model_type: str) -> str | None:
    """Why Liger-Kernel cannot patch this family with the installed Transformers, or None when it can (its Qwen-VL
    forwards import output classes that some Transformers releases no longer define)."""
    try:
        importlib.import_module(LIGER[model_type][1])
    except ImportError as e:
        import liger_kernel
        import transformers

        version = getattr(liger_kernel, "__version__", None) or importlib.metadata.version("liger-kernel")
        return f"Liger-Kernel {version} cannot import its {model_type} forward on Transformers " \
               f"{transformers.__version__}: {e}"
    return None


def apply_liger(model, **kernels):
    """Liger's kernels for ``model``'s family, on this instance (its forward) and its module (the rotary globals)."""
    import liger_kernel.transformers as liger

    name, _, _ = LIGER[model.config.model_type]
    getattr(liger, name)(model=model, **kernels)
    return model


@contextlib.contextmanager
def modeling_globals_restored(model_type: str):
    """Put back the modeling module's rotary functions afterwards (Liger replaces them for the whole process)."""
    module = importlib.import_module(LIGER[model_type][2])
    saved = {n: getattr(module, n) for n in _ROPE_GLOBALS if hasattr(module, n)}
    try:
        yield module
    finally:
        for n in _ROPE_GLOBALS:
            if n in saved:
                setattr(module, n, saved[n])
            elif hasattr(module, n):  # (a name Liger added that this Transformers does not define)
                delattr(module, n)


def batch_for(preset: str) -> dict:
    config = load_config(preset)
    unit = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    batch = build_inputs(config, named_layout("mixed", 2 * unit, unit), pad_token_id=PRESETS[preset].pad_token_id)
    batch["labels"] = labels_for(batch)
    return batch


def prepared_forward(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Logits and loss from a prepared batch on the emulated device, and the syncs that forward made."""
    with torch.no_grad(), syncfree.emulate_cuda():
        model.to("cuda")
        kwargs = syncfree.prepare(batch, "cuda", model)
        with syncfree.audit() as report:
            out = model(**kwargs)
        logits, loss = out.logits.to("cpu"), out.loss.to("cpu")
        model.to("cpu")
    return logits, loss, len(report.syncs)


def compose(preset: str, order: str) -> dict:
    """Liger's forward and syncfree on one model, ``order`` "liger first" or "syncfree first"; what holds after."""
    model = build_model(preset)
    kernels = dict(rope=False, rms_norm=False, swiglu=False, fused_linear_cross_entropy=True)  # (Triton: GPU only)
    if order == "liger first":
        syncfree.patch(apply_liger(model, **kernels))
    else:
        apply_liger(syncfree.patch(model), **kernels)
    lce_forward = importlib.import_module(LIGER[model.config.model_type][1]).lce_forward
    return {"liger forward": getattr(model.forward, "__func__", None) is lce_forward,
            "syncfree patched": syncfree.is_patched(model), "model": model}


def rotary_kernels_seen(preset: str, order: str) -> tuple[list[str], bool]:
    """The module's rotary functions Liger replaced (those this Transformers defines: on a release where the family
    has no such name, Liger adds one that nothing calls), and whether the functions syncfree rewrote in the family's
    modeling module (its vision attention among them) call Liger's: they look their globals up in the module."""
    model_type = load_config(preset).model_type
    with modeling_globals_restored(model_type) as module:
        before = {n: getattr(module, n) for n in _ROPE_GLOBALS if hasattr(module, n)}
        model = build_model(preset)
        kernels = dict(rope=True, rms_norm=False, swiglu=False, fused_linear_cross_entropy=False)
        if order == "liger first":
            syncfree.patch(apply_liger(model, **kernels))
        else:
            apply_liger(syncfree.patch(model), **kernels)
        replaced = [n for n, f in before.items() if getattr(module, n) is not f]
        attention = next(m for n, m in model.named_modules() if n.endswith("blocks.0.attn"))
        rewritten = type(attention).forward
        seen = (getattr(rewritten, "__wrapped__", None) is None  # (a rewrite, not a wrapper)
                and rewritten.__globals__ is vars(module)
                and all(rewritten.__globals__[n] is getattr(module, n) for n in replaced))
        return replaced, seen


def main(preset: str = "qwen3-vl-tiny") -> dict:
    reason = liger_unavailable(load_config(preset).model_type)
    if reason:
        print(reason)
        return {"unavailable": reason}
    batch = batch_for(preset)
    stock = build_model(preset)
    with torch.no_grad():
        out = stock(**batch)
    found = {}
    for order in ("liger first", "syncfree first"):
        composed = compose(preset, order)
        logits, loss, syncs = prepared_forward(composed.pop("model"), batch)
        replaced, seen = rotary_kernels_seen(preset, order)
        found[order] = {**composed, "logits equal": torch.equal(logits, out.logits),
                        "loss equal": torch.equal(loss, out.loss), "prepared syncs": syncs,
                        "rotary functions Liger replaced": replaced, "seen by syncfree's rewrites": seen}
        print(f"{order}: {found[order]}")
    return found


if __name__ == "__main__":
    # An example that could not do its job says so in its exit status (2: Liger-Kernel cannot patch this model with
    # the installed releases; the reason is printed above).
    sys.exit(2 if "unavailable" in main(*sys.argv[1:]) else 0)
