"""Qwen4-Exp: Qwen3.5's vision tower and multimodal forward (Qwen3-VL's rotary index) before a new text model.

Its tower, vision attention, rotary index and multimodal forward are Qwen3.5's, statement for statement, so
Qwen3.5's targets apply as they are (``qwen3_vl_targets`` without deepstack; each edit still matches the family's
own copy of the code). Its text model mixes gated-DeltaNet layers (with n-gram per-layer embeddings) and
``indexed_attention`` layers whose QSA indexer picks, for every (row, query), the key blocks that query attends to:
stock finds each query's visible keys with ``torch.nonzero`` of the causal mask row (a read of the device per row
and query). ``QSA_VISIBLE`` (``edits.py``) takes their number from the host instead (``qsa.py``: the family's own
helpers, which its edits see under ``_syncfree``). The processor is Qwen3-VL's: one run per video frame between
the config's vision start/end ids, timestamps between frames.
"""

from __future__ import annotations

from ...plan.hooks import PlanHooks
from ...plan.spec import Layout
from ...rewrite.edits import CHUNK_DELTA_RULE
from ...rewrite.targets import Family, Target
from ..group import FamilyGroup
from ..preset import Preset
from ..qwen_vl import QWEN3_LAYOUT, qwen3_vl_targets
from ..qwen_vl.inputs import build_inputs
from ..shared import family_module, installed_source_has
from . import qsa, stream
from .edits import QSA_MASK, QSA_SELECT, QSA_VISIBLE
from .qsa import make_generation_masks

__all__ = ["CENSUS_FIXES", "FAMILIES", "PRESETS", "VISION_CLASSES", "GROUP"]

_P = "Qwen4Exp"

_TARGETS = qwen3_vl_targets(_P, deepstack=False) + (
    Target(f"{_P}TextModel", "forward", edits=QSA_MASK),
    Target(f"{_P}TextQSAIndexer", "forward", edits=QSA_VISIBLE, alt_attrs=("_select_tokens",)),
    # (where the selection is a method of its own, ``forward``'s call of it: one operator in a stream's traced forward;
    # and, as in Qwen3.5, the gated-DeltaNet layers' chunked delta rule)
    Target(f"{_P}TextQSAIndexer", "forward", edits=QSA_SELECT, optional=True),
    Target(f"{_P}TextGatedDeltaNet", "forward", edits=CHUNK_DELTA_RULE, optional=True),
    # (generate() with a static cache makes the masks itself: the counts for its indexed layers' mask)
    Target(f"{_P}ForConditionalGeneration", "prepare_inputs_for_generation", wrap=make_generation_masks,
           inherited=True),
)
# (its text model: Qwen3.5's gated-DeltaNet layers and a QSA indexer over each row's key blocks)
_PACKING = ("its gated-DeltaNet layers carry their state across the samples of a packed row, and its QSA indexer "
            "picks key blocks over the whole row")
# Registered where the installed Qwen4-Exp has the indexed-attention layers its QSA edits stand for (Transformers
# 5.24; 5.17 names them qwen_sparse_attention, with other code: left stock there).
# One graph serves a stream where the indexer's selection is a method of its own (5.25: ``stream.py`` runs that call as
# one operator) and the DeltaNet layers call the chunked rule; where the loop is inline in ``forward`` (5.24), one
# graph per layout.
_STREAM = installed_source_has(family_module("qwen4_exp"), "def _select_tokens(", "torch_chunk_gated_delta_rule(")
FAMILIES: tuple[Family, ...] = () if not installed_source_has(family_module("qwen4_exp"), "indexed_attention") else (
    Family("qwen4_exp", _TARGETS, Layout(family_module("qwen4_exp"), **QWEN3_LAYOUT, packing_refused=_PACKING, one_graph=True,
                                         stream=_STREAM, plan=PlanHooks(fields=qsa.planned_counts)),
           helpers={**{name: getattr(qsa, name) for name in qsa.__all__}, "select_tokens": stream.select_tokens}),
)

# A tiny model with the real layout rules: patch 16, temporal patch 2, merge 2, an 8x8 learned table; interleaved
# M-RoPE on a quarter of the head; DeltaNet layers (the first with n-gram per-layer embeddings) and two
# indexed_attention layers whose QSA indexer pools blocks of 2 keys and keeps the best 2 blocks (a budget of 4
# tokens), so a short prompt already has more blocks than it keeps; 4 experts (2 per token) and a shared one.
_Q4_TINY = dict(
    model_type="qwen4_exp", tie_word_embeddings=False, image_token_id=1000, video_token_id=1001,
    vision_start_token_id=1002, vision_end_token_id=1003,
    vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                       hidden_act="gelu_pytorch_tanh", in_channels=3, patch_size=16, temporal_patch_size=2,
                       spatial_merge_size=2, num_position_embeddings=64),
    text_config=dict(vocab_size=1024, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-6,
                     layer_types=["linear_attention", "indexed_attention"] * 2,
                     rope_parameters=dict(rope_type="default", rope_theta=10_000_000, mrope_section=[1, 1, 0],
                                          mrope_interleaved=True, partial_rotary_factor=0.25),
                     linear_conv_kernel_dim=2, linear_key_head_dim=16, linear_value_head_dim=16,
                     linear_num_key_heads=2, linear_num_value_heads=4,
                     num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                     shared_expert_intermediate_size=32, hc_count=2, hc_lowrank=8,
                     ple_layer_ids=[1], ple_embed_dim=16, ple_conv_kernel_size=2, ngram_size=3, heads_per_ngram=2,
                     ngram_vocab_size_base=31, make_ngram_vocab_size_divisible_by=8, split_ngram_parts=4,
                     indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=4,
                     indexer_compress_ratio=2,
                     # (the n-gram embeddings put the end-of-text id where the mask pads: the config must name one)
                     pad_token_id=0, bos_token_id=None, eos_token_id=1004),
)
PRESETS: dict[str, Preset] = {
    "qwen4-exp-tiny": Preset("qwen4-exp-tiny", _Q4_TINY, 0,
                             "tiny Qwen4-Exp for tests (DeltaNet, QSA-indexed attention, MoE, n-gram embeddings)"),
}
VISION_CLASSES = {"qwen4_exp": f"{_P}VisionModel"}


# The census's config fix (``census.fixes``): what its shrunk default config needs to build (declared for the family's
# model types whether or not this release registers them: the census runs every family Transformers ships).
def _census_fix_qwen4_exp(config) -> None:
    # Its "indexed_attention" layers build a QSA token indexer, which the default config leaves unset (the
    # checkpoint's config sets it): one key head (required) and a rotary width that fits the index head.
    text = config.text_config
    text.indexer_n_heads, text.indexer_kv_heads = 2, 1
    text.indexer_head_dim = text.head_dim
    text.indexer_compress_ratio, text.indexer_budget = 4, 16


CENSUS_FIXES = {"qwen4_exp": _census_fix_qwen4_exp}


# The group, as the registry reads it (``families.GROUPS``).
GROUP = FamilyGroup(FAMILIES, build_inputs, presets=PRESETS, vision_classes=VISION_CLASSES, census_fixes=CENSUS_FIXES,
                    display={"qwen4_exp": "Qwen4-Exp"})
