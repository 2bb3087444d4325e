"""The stock lines syncfree rewrites in ERNIE-4.5-VL: its modality MoE block (calling the family's own helpers,
``modality_moe.py``, its ``Family.helpers``) and its resampler's frame pairs (calling the shared ``host_index_to``).
"""

from __future__ import annotations

from ...rewrite.edits import feature_split
from ...rewrite.rewriter import Edit

__all__ = ["MODALITY_MOE", "TEMPORAL_SLICES", "TEMPORAL_SLICES_CALL", "FEATURE_SPLITS"]

# ERNIE-4.5-VL's MoE block runs text and vision tokens through separate experts: it asks whether the batch has
# vision tokens, then moves each kind's rows with boolean masks over the hidden width (each one a read of the
# count, forward and backward). From the plan's host copy of moe_mm_token_type_ids instead: the answer on the
# host, the rows by positions found once per forward (``modality_moe.py``).
MODALITY_MOE = (
    Edit("expr", "moe_mm_token_type_ids.any()", "_syncfree.any_vision_token(moe_mm_token_type_ids)"),
    Edit("stmt", "moe_mm_token_type_ids = moe_mm_token_type_ids.bool()",
         "syncfree_rows = _syncfree.modality_rows(moe_mm_token_type_ids)\n"
         "moe_mm_token_type_ids = moe_mm_token_type_ids.bool()"),
    Edit("stmt", """
         final_hidden_states[~token_type_ids_states], router_logits[~token_type_ids_router] = self.text_moe(
             hidden_states[~token_type_ids_states])""", """
         _syncfree.experts_by_modality(self.text_moe, hidden_states, ~token_type_ids_states, ~token_type_ids_router,
                                       final_hidden_states, router_logits,
                                       None if syncfree_rows is None else syncfree_rows.text)"""),
    Edit("stmt", """
         final_hidden_states[token_type_ids_states], router_logits[token_type_ids_router] = self.vision_moe(
             hidden_states[token_type_ids_states])""", """
         _syncfree.experts_by_modality(self.vision_moe, hidden_states, token_type_ids_states, token_type_ids_router,
                                       final_hidden_states, router_logits,
                                       None if syncfree_rows is None else syncfree_rows.vision)"""),
)

# ERNIE-4.5-VL's resampler builds the indices that pair each video's frames on the host (from the host grid the
# patched forward hands it) and moves them with a blocking copy from pageable memory: pinned and non-blocking
# instead (the same values; ``rewrite/host_index.py``).
TEMPORAL_SLICES = (
    # (the rows it walks: the plan's in a traced forward, ``frame_pairs``)
    Edit("expr", "zip(grid_t, grid_hw_after_conv, batch_offsets)",
         "_syncfree.frame_pair_rows(grid_thw, self.spatial_merge_size, grid_t, grid_hw_after_conv, batch_offsets)"),
    Edit("stmt", "first_slice_offsets = torch.cat(first_slice_offsets, dim=-1).to(hidden_states.device)",
         "first_slice_offsets = _syncfree.host_index_to(torch.cat(first_slice_offsets, dim=-1), hidden_states.device)"),
    Edit("stmt", "second_slice_offsets = torch.cat(second_slice_offsets, dim=-1).to(hidden_states.device)",
         "second_slice_offsets = _syncfree.host_index_to(torch.cat(second_slice_offsets, dim=-1), "
         "hidden_states.device)"),
)

# The resampler's call of its frame pairing: in a traced stream forward, one operator over the plan's host grid
# (``stream.temporal_slices``).
TEMPORAL_SLICES_CALL = (
    Edit("expr", "self._temporal_slicing(hidden_states, grid_thw)",
         "_syncfree.temporal_slices(self._temporal_slicing, hidden_states, grid_thw, self.spatial_merge_size)"),
)

# get_image_features and get_video_features split the resampled features per item by sizes read from the grid (host
# values in eager): from the plan's rows in a traced forward (the image's the shared ``feature_split``; the video's
# divided by the temporal merge too, ``stream.video_feature_sizes``).
FEATURE_SPLITS = feature_split("self.vision_tower.spatial_merge_size", kinds=("image",)) + (
    Edit("expr", "(video_grid_thw.prod(-1) // self.vision_tower.spatial_merge_size**2 "
                 "// self.resampler_model.temporal_merge_size).tolist()",
         "_syncfree.video_feature_sizes(video_grid_thw, self.vision_tower.spatial_merge_size, "
         "self.resampler_model.temporal_merge_size)"),
)
