"""Run by tests/test_packed_linear_attention.py in a subprocess whose PYTHONPATH holds tests/standins."""

from __future__ import annotations

import json
import sys

import torch

import syncfree
from syncfree.presets import build_model


def main() -> None:
    import causal_conv1d
    import fla.ops.gated_delta_rule as fla

    model = build_model("qwen3.5-tiny")
    lengths = [5, 9, 3]  # three sequences packed padding-free into one row, as DataCollatorWithFlattening does
    batch = {"input_ids": torch.randint(1, 900, (1, sum(lengths)), generator=torch.Generator().manual_seed(0)),
             "position_ids": torch.cat([torch.arange(n) for n in lengths])[None],
             "cu_seq_lens_q": torch.tensor([0, 5, 14, 17], dtype=torch.int32), "max_length_q": 9}
    batch.update(cu_seq_lens_k=batch["cu_seq_lens_q"], max_length_k=9)
    out = {"linear_layers": sum(t == "linear_attention" for t in model.config.text_config.layer_types)}
    with syncfree.emulate_cuda(), torch.no_grad():
        model.to("cuda")
        # (The reference on the emulated device too: from 5.25 Transformers hands the stand-in kernels device inputs
        # only, and refuses a packed batch on the host.)
        expected = model(**{k: v.to("cuda") if isinstance(v, torch.Tensor) else v for k, v in batch.items()},
                         use_cache=False).logits.cpu()
        for variant in ("stock", "patched", "patched+prepare"):
            if variant == "patched":
                syncfree.patch(model)
            inputs = (syncfree.prepare(batch, "cuda", model) if variant == "patched+prepare"
                      else {k: v.to("cuda") if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
            fla.SEEN.clear()
            causal_conv1d.SEEN.clear()
            with syncfree.audit() as report:
                logits = model(**inputs, use_cache=False).logits
            out[variant] = {"syncs": [e.line for e in report.syncs], "blocking": len(report.blocking_copies),
                            "equal": bool(torch.equal(logits.cpu(), expected)), "chunk_calls": list(fla.SEEN),
                            "conv_calls": list(causal_conv1d.SEEN)}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
