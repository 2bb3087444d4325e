"""Patch a model whose modeling code is a copy of a supported family under other names.

A ``trust_remote_code`` checkpoint or a downstream fork often ships a copy of Qwen2.5-VL's modeling file with its
module, class and model-type names changed. ``syncfree.patch(model, like="qwen2_5_vl")`` patches it: the edits
match code, so they apply to the copy where its code is Qwen2.5-VL's, and the copy is refused, with the usual
message, where it is not.

This example makes such a copy at run time (Transformers' own Qwen2.5-VL files, renamed to ``MyVL`` in a package
``my_vl`` of a temporary folder), builds a tiny random-weight model from it, patches it, and checks the logits
against the unpatched copy and the syncs on the emulated device (no GPU needed):

    python examples/patch_a_fork.py
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import tempfile

import torch
import transformers

import syncfree
from syncfree.inputs import build_inputs, named_layout
from syncfree.presets import PRESETS

RENAMES = (("Qwen2_5_VL", "MyVL"), ("Qwen2_5_", "My"), ("qwen2_5_vl", "my_vl"))


def make_fork(folder: str):
    """A package ``my_vl`` in ``folder``: Transformers' Qwen2.5-VL configuration and modeling files, renamed, with
    their relative imports made absolute (as a copied remote-code file has them). Returns the modeling module."""
    source = os.path.join(os.path.dirname(transformers.__file__), "models", "qwen2_5_vl")
    package = os.path.join(folder, "my_vl")
    os.makedirs(package, exist_ok=True)
    open(os.path.join(package, "__init__.py"), "w").close()
    for name in ("configuration_qwen2_5_vl.py", "modeling_qwen2_5_vl.py"):
        with open(os.path.join(source, name), encoding="utf-8") as f:
            text = f.read()
        text = re.sub(r"^(\s*)from \.\.\.", r"\1from transformers.", text, flags=re.M)
        for old, new in RENAMES:
            text = text.replace(old, new)
        with open(os.path.join(package, name.replace("qwen2_5_vl", "my_vl")), "w", encoding="utf-8") as f:
            f.write(text)
    sys.path.insert(0, folder)
    importlib.invalidate_caches()
    return importlib.import_module("my_vl.modeling_my_vl")


def tiny_fork_model(modeling):
    """A tiny random-weight model of the copy, with the Qwen2.5-VL tiny preset's sizes."""
    config_module = importlib.import_module("my_vl.configuration_my_vl")
    preset = PRESETS["qwen2.5-vl-tiny"]
    config = config_module.MyVLConfig(**{k: v for k, v in preset.values.items() if k != "model_type"})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return modeling.MyVLForConditionalGeneration(config).eval()


def main() -> dict:
    with tempfile.TemporaryDirectory() as folder:
        modeling = make_fork(folder)
        model = tiny_fork_model(modeling)
        batch = build_inputs(model.config, named_layout("mixed", side=56, unit=28))
        with torch.no_grad():
            expected = model(**batch).logits
        syncfree.patch(model, like="qwen2_5_vl")
        with torch.no_grad():
            same = torch.equal(model(**batch).logits, expected)
        with syncfree.emulate_cuda():
            model.to("cuda")
            inputs = syncfree.prepare(batch, "cuda", model)
            with syncfree.audit() as report, torch.no_grad():
                model(**inputs)
            model.to("cpu")
        result = {"model": type(model).__module__, "same_logits": same, "prepared_syncs": len(report.syncs),
                  "patched": syncfree.is_patched(model)}
        syncfree.unpatch(model)
        sys.path.remove(folder)
    print(f"{result['model']}: patched like qwen2_5_vl; logits equal to the unpatched copy: {result['same_logits']}; "
          f"syncs with prepare: {result['prepared_syncs']}")
    return result


if __name__ == "__main__":
    main()
