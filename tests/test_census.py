"""The generic split fix on a family syncfree does not fully support, and the census over a handful of families."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import syncfree
from syncfree.audit import audit, emulate_cuda
from syncfree.census import census_family, discover
from syncfree.census.tiny import build_tiny, qwen_vl_style_batch

FAMILIES = discover()
# A family with the generic fix whose tiny model takes the census's Qwen-VL-style batch (none in Transformers 5.17:
# the ones it has are fully supported now, or need other inputs).
GENERIC = "lfm3_vl"


@pytest.fixture(scope="module")
def generic():
    if GENERIC not in FAMILIES:
        pytest.skip(f"this Transformers release has no {GENERIC}")
    stock = build_tiny(GENERIC)
    return stock, qwen_vl_style_batch(stock)


def _syncs(model, batch):
    with emulate_cuda(), torch.no_grad():
        model.to("cuda")
        try:
            moved = {k: v.to("cuda") for k, v in batch.items()}
            with audit() as report:
                out = model(**moved).logits
            return report, out.cpu()
        finally:
            model.to("cpu")
            if hasattr(model.model, "rope_deltas"):  # the forward caches it on the model: an emulated tensor otherwise
                model.model.rope_deltas = None


def test_discovery_reads_the_installed_sources():
    assert {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"} <= set(FAMILIES)
    assert "llama" not in FAMILIES  # no vision attention split there


def test_generic_fix_reads_the_split_once_per_tower_call_and_changes_no_output(generic, capsys):
    stock, batch = generic
    patched = syncfree.patch(copy.deepcopy(stock), verbose=True)
    said = capsys.readouterr().out
    assert "generic fix" in said and "Lfm3VlVisionAttention.forward" in said and "keeps its syncs" in said
    stock_report, expected = _syncs(stock, batch)
    patched_report, got = _syncs(patched, batch)
    assert torch.equal(got, expected)
    # Stock reads the sizes for q, k and v in every block the tower runs (LFM3-VL's runs all but its last).
    split = [e for e in stock_report.syncs if "lengths.tolist()" in e.where.code]
    assert len(split) % 3 == 0 and len(split) >= 3
    assert len([e for e in patched_report.syncs if "lengths.tolist()" in e.where.code]) == 1
    assert len(patched_report.syncs) == len(stock_report.syncs) - len(split) + 1


def test_a_generically_patched_model_pickles_patched(generic):
    stock, batch = generic
    restored = pickle.loads(pickle.dumps(syncfree.patch(copy.deepcopy(stock))))
    assert syncfree.is_patched(restored)
    report, _ = _syncs(restored, batch)
    assert len([e for e in report.syncs if "lengths.tolist()" in e.where.code]) == 1


def test_a_model_without_the_split_is_refused():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, vocab_size=64))
    with pytest.raises(ValueError, match="no supported model in LlamaForCausalLM .*and no vision attention"):
        syncfree.patch(model)


@pytest.mark.parametrize("family", ["qwen3_vl", GENERIC, "minicpmv4_6", "qwen2_5_omni"])
def test_census_rows(family):
    if family not in FAMILIES:
        pytest.skip(f"this Transformers release has no {family}")
    row = census_family(family)
    if family == "qwen2_5_omni":  # an Omni model: its thinker, on an Omni batch (audio, image, video)
        assert (row.status, row.support, row.prepared_syncs, row.same_outputs) == ("ok", "full", 0, True)
        assert row.patched_syncs == 1 and row.stock_syncs > 50
    elif family == "qwen3_vl":
        assert (row.status, row.support, row.prepared_syncs, row.same_outputs) == ("ok", "full", 0, True)
        assert row.patched_syncs == 1 and row.stock_syncs > 10
    elif family == GENERIC:
        assert (row.status, row.support, row.same_outputs) == ("ok", "generic", True)
        assert row.patched_syncs < row.stock_syncs and row.prepared_syncs is None
    else:  # no Qwen-VL-style inputs: listed with the reason, not skipped
        assert row.status == "not built" and "not a Qwen-VL-style input" in row.reason
