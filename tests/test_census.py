"""The generic split fix on a family syncfree does not fully support, and the census over a handful of families."""

from __future__ import annotations

import copy
import pickle
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import syncfree
from family_checks import registration_lifted
from syncfree.audit import audit, emulate_cuda
from syncfree.census import census_family, discover
from syncfree.census.inputs import PACKINGS, census_batch
from syncfree.census.reasons import KNOWN_GAPS
from syncfree.census.run import tiny_model_and_batch
from syncfree.families import FAMILIES as registered_families

FAMILIES = discover()
REGISTERED = registered_families
# A family given the generic fix only: MiniCPM-V 4.7 with its registration lifted (its census batch is then a NaViT
# strip with target_sizes; every family with the split whose tiny model builds is fully supported now; Transformers
# 5.17 has no MiniCPM-V 4.7: the tests that need it skip there).
GENERIC = "minicpmv4_7"


@pytest.fixture(scope="module")
def _generic_model():
    if GENERIC not in FAMILIES:
        pytest.skip(f"this Transformers release has no {GENERIC}")
    return tiny_model_and_batch(GENERIC)


@pytest.fixture
def generic(_generic_model):
    with registration_lifted(GENERIC):  # (for the test only: the other tests see it registered)
        yield _generic_model


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
    assert "generic fix" in said and "MiniCPMV4_7VisionAttention.forward" in said and "keeps its syncs" in said
    stock_report, expected = _syncs(stock, batch)
    patched_report, got = _syncs(patched, batch)
    assert torch.equal(got, expected)
    # Stock reads the sizes for q, k and v in every block of the tower.
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


@pytest.mark.parametrize("family", ["qwen3_vl", GENERIC, "radio", "qwen2_5_omni"])
def test_census_rows(family):
    if family not in FAMILIES:
        pytest.skip(f"this Transformers release has no {family}")
    row = census_family(family, graph_breaks=False)  # (the breaks, the slowest part of a row: tested below)
    if family == "qwen2_5_omni":  # an Omni model: its thinker, on an Omni batch (audio, image, video)
        assert (row.status, row.support, row.prepared_syncs, row.same_outputs) == ("ok", "full", 0, True)
        assert row.patched_syncs == 1 and row.stock_syncs > 50
    elif family == "qwen3_vl":
        assert (row.status, row.support, row.prepared_syncs, row.same_outputs) == ("ok", "full", 0, True)
        assert row.patched_syncs == 1 and row.stock_syncs > 10
        # The figures a user compares: kernel launches and host time (graph breaks: below).
        assert 0 < row.patched_launches <= row.stock_launches
        assert row.stock_ms > 0 and row.patched_ms > 0 and row.stock_breaks is None
    elif family == GENERIC:  # fully supported; with its registration lifted, the generic fix
        assert (row.status, row.support, row.prepared_syncs, row.same_outputs) == ("ok", "full", 0, True)
        with registration_lifted(GENERIC):
            row = census_family(family, graph_breaks=False)
        assert (row.status, row.support, row.same_outputs) == ("ok", "generic", True)
        assert row.patched_syncs < row.stock_syncs and row.prepared_syncs is None
    else:  # a known gap: listed with its one-line reason, not the raw exception, and not skipped
        assert row.status != "ok" and row.reason == KNOWN_GAPS[family]


@pytest.mark.slow  # (Dynamo traces the whole forward twice)
def test_census_counts_the_whole_forwards_graph_breaks_and_names_each_site():
    whole = census_family("qwen3_vl")  # (a family whose prepared forward traces as one graph)
    assert whole.status == "ok" and whole.stock_breaks > 0 and whole.patched_breaks == 0 and whole.break_sites == []
    row = census_family("inkling2")  # (one that still breaks: a generic-fix family runs stock's forward)
    assert row.status == "ok" and row.stock_breaks > 0 and row.patched_breaks and row.break_sites
    assert all(re.match(r"(\d+x )?[\w/.]+\.py:\d+: \S", site) for site in row.break_sites), row.break_sites


# Families the census runs through a config fix or an input packing of their own (census.fixes, census.inputs):
# the stock Qwen-VL-style batch and shrinker did not fit them.
# (MiniCPM-V 4.6 and Muse Spark take the same hooks as MiniCPM-V 4.7 and Muse Glimmer: left to `syncfree census`.)
# (GLM-Image's target grids and images_per_sample come from its family's processor layout: where Transformers ships the
# older code syncfree does not register, the census has no layout for it.)
REGISTERED_ONLY_HOOKED = ("glm_image",)
HOOKED = ["cohere_compass", "glm5_next", "glm_image", "hunyuan_vl", "hy_v4_vl", "inkling2", "kimi_k25", "minicpm_ocr",
          "minicpmv4_7", "minimax_m3_vl", "muse_glimmer", "qwen4_exp", "video_llama_3"]


# The hooked families whose tiny census model takes longest (reference kernels, several towers): the slow step.
HEAVY_HOOKED = {"glm5_next", "inkling2", "kimi_k25", "muse_glimmer", "qwen4_exp", "hy_v4_vl", "cohere_compass"}


@pytest.mark.parametrize("family", [pytest.param(f, marks=[pytest.mark.slow] * (f in HEAVY_HOOKED)) for f in HOOKED])
def test_a_hooked_family_builds_runs_and_keeps_its_outputs(family):
    if family not in FAMILIES:
        pytest.skip(f"this Transformers release has no {family}")
    if family in REGISTERED_ONLY_HOOKED and family not in REGISTERED:
        pytest.skip(f"{family}'s inputs are laid out by its family, registered only for its newer code")
    row = census_family(family, graph_breaks=False)
    assert row.status == "ok", row.reason
    assert row.support in ("generic", "full") and row.same_outputs is True  # (Cohere Compass: full support since)
    # The generic fix never adds a sync (Inkling2's tower reads a host copy of its grid: nothing to remove).
    assert row.patched_syncs <= row.stock_syncs


def test_a_known_gap_prints_its_traceback_under_debug(capsys):
    family = "radio"
    if family not in FAMILIES:
        pytest.skip(f"this Transformers release has no {family}")
    row = census_family(family, debug=True)
    assert row.reason == KNOWN_GAPS[family] and "Traceback" in capsys.readouterr().err
    assert all("\n" not in reason for reason in KNOWN_GAPS.values())


class _Config:
    def __init__(self, model_type, **fields):
        self.model_type, self.image_token_id = model_type, 7
        self.vision_config = type("Vision", (), {"patch_size": 2, "spatial_merge_size": 2, "temporal_patch_size": 2,
                                                 "num_channels": 3, **fields})()


@given(family=st.sampled_from(sorted(PACKINGS) + ["qwen2_vl"]), images=st.integers(1, 3))
@settings(max_examples=40, deadline=None)
def test_a_packed_batch_agrees_with_itself(family, images):
    """As many placeholders as the packing says, pixels for every patch of the grid, images of different sizes."""
    packing = PACKINGS.get(family)
    model = type("Model", (), {"config": _Config(family)})()
    batch = census_batch(model, images=images)
    grid = batch[packing.grid_key if packing else "image_grid_thw"]
    assert len(grid) == images and len({tuple(row) for row in grid.tolist()}) == images
    placeholders = int((batch["input_ids"] == 7).sum())
    assert placeholders == int(batch["mm_token_type_ids"].sum())
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["mm_token_type_ids"].shape
    pixels = batch["pixel_values"]
    if packing is None:  # Qwen2-VL: a row per patch, a placeholder per merge x merge patches
        assert pixels.shape[0] == int(grid.prod(-1).sum()) and placeholders == pixels.shape[0] // 4
    elif packing.pixels in ("flat", "conv"):
        assert pixels.shape[0] == int(grid.prod(-1).sum())
    elif packing.pixels == "token":  # one block per placeholder, the grid counting placeholders
        assert pixels.shape[0] == placeholders == int(grid.prod(-1).sum())
    elif packing.pixels == "navit":  # one strip of (h, w) patches
        assert pixels.shape[-1] == 2 * int(grid.prod(-1).sum())


def test_the_census_command_plots_stock_patched_and_prepared_syncs(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from syncfree.cli import main

    assert main(["census", "--families", "qwen2_vl", "--no-graph-breaks", "--out", str(tmp_path)]) == 0
    png = tmp_path / "census.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(png) in capsys.readouterr().out


def test_without_matplotlib_the_census_says_no_png_was_written(tmp_path, monkeypatch, capsys):
    import sys

    from syncfree.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert main(["census", "--families", "qwen2_vl", "--no-graph-breaks", "--out", str(tmp_path)]) == 0
    assert "no PNG plot written: matplotlib is not installed" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.png")) and (tmp_path / "census.json").exists()
