"""The stock lines syncfree rewrites in MiniCPM's code: its NaViT tower's segments and window merger (calling the
family's own helpers, ``navit.py``, its ``Family.helpers``), and its placeholder mask and scatter, which serve both
kinds through one name (calling the shared ones).
"""

from __future__ import annotations

from ...rewrite.rewriter import Edit

__all__ = ["NAVIT_CU_SEQLENS", "PLACEHOLDER_BY_TOKEN_ID", "FEATURE_SCATTER_MASK", "NAVIT_WINDOW_MERGER",
           "NAVIT_MERGED_CU_SEQLENS", "HALVED_SIZES", "FRAME_SIZES", "MERGER_CROP_SIZE"]

# MiniCPM-V's NaViT tower builds its segments' cumulative lengths from ``target_sizes`` and copies them to the device
# (from the plan's host sizes the wrapper hands it: a blocking copy): the plan's, moved with it, instead.
NAVIT_CU_SEQLENS = (
    Edit("stmt", """
         cu_seqlens = F.pad(torch.cumsum(target_sizes[:, 0] * target_sizes[:, 1], dim=0, dtype=torch.int32).to(
             hidden_states.device), (1, 0))""", """
         cu_seqlens = _syncfree.navit_cu_seqlens(kwargs, lambda: F.pad(torch.cumsum(
             target_sizes[:, 0] * target_sizes[:, 1], dim=0, dtype=torch.int32).to(hidden_states.device), (1, 0)))"""),
)

# MiniCPM-V's get_placeholder_mask serves both kinds (``token_id`` says which): its count and its check by boolean
# select, from the plan's counts (the same message and error).
_KIND = '"image" if token_id == self.config.image_token_id else "video"'
PLACEHOLDER_BY_TOKEN_ID = (
    Edit("stmt", "n_tokens = special_mask.sum()",
         f"n_tokens = _syncfree.placeholder_count(input_ids, special_mask, {_KIND})"),
    Edit("expr", "inputs_embeds[special_mask].numel()",
         f"_syncfree.placeholder_numel(inputs_embeds, special_mask, input_ids, {_KIND})"),
)

# MiniCPM-V's forward scatters both kinds through one mask name: the kind comes from the features' name.
FEATURE_SCATTER_MASK = (
    Edit("expr", "inputs_embeds.masked_scatter(mask, image_features)",
         '_syncfree.scatter_features(inputs_embeds, mask, image_features, input_ids, "image")'),
    Edit("expr", "inputs_embeds.masked_scatter(mask, video_features)",
         '_syncfree.scatter_features(inputs_embeds, mask, video_features, input_ids, "video")'),
)

# MiniCPM-V's in-tower window merger ("16x"): its window order and boundaries (stock builds them on the host from the
# host sizes and copies them over) and its window attention's split sizes, from the tables the tower wrapper made
# (``navit.py``); stock's own where there are none.
NAVIT_WINDOW_MERGER = (
    Edit("stmt", "window_index, window_cu_seqlens, window_max_seqlens = self.get_window_index(target_sizes, "
                 "kwargs=kwargs)",
         "window_index, window_cu_seqlens, window_max_seqlens = _syncfree.navit_window_index(self, target_sizes, "
         "kwargs)"),
    Edit("stmt", """
         hidden_states, _ = self.self_attn(hidden_states=hidden_states, cu_seqlens=window_cu_seqlens.to(device),
                                           max_seqlen=window_max_seqlens)""", """
         hidden_states, _ = self.self_attn(hidden_states=hidden_states, cu_seqlens=window_cu_seqlens.to(device),
                                           max_seqlen=window_max_seqlens,
                                           **_syncfree.navit_window_kwargs(kwargs, self, target_sizes))"""),
)

# The crops after a 2x2 merge (``target_sizes // 2``): the same tensor, noted with its rows in a traced forward.
HALVED_SIZES = (Edit("stmt", "target_sizes = target_sizes // 2", "target_sizes = _syncfree.halved_sizes(target_sizes)"),)

# The segments after the window merger (4x shorter, as many): the planned ones, with their own split sizes.
NAVIT_MERGED_CU_SEQLENS = HALVED_SIZES + (
    Edit("stmt", """
         cu_seqlens = F.pad(torch.cumsum(target_sizes[:, 0] * target_sizes[:, 1], dim=0, dtype=torch.int32).to(
             device), (1, 0))""", """
         cu_seqlens = _syncfree.navit_merged_cu_seqlens(kwargs, lambda: F.pad(torch.cumsum(
             target_sizes[:, 0] * target_sizes[:, 1], dim=0, dtype=torch.int32).to(device), (1, 0)), target_sizes,
             device)"""),
)

# get_video_features: every frame's crops (one repeat: the forward hands the first row of the packed pixels), noted
# with their rows in a traced forward.
FRAME_SIZES = (
    Edit("stmt", "target_sizes = target_sizes_videos.repeat(num_frames, 1)",
         "target_sizes = _syncfree.frame_sizes(target_sizes_videos, num_frames)"),
)

# The merger's per-crop loop slices the features by each crop's size: Python ints from the plan in a traced forward.
MERGER_CROP_SIZE = (
    Edit("stmt", "height, width = target_sizes[batch_idx]", "height, width = _syncfree.crop_size(target_sizes, batch_idx)"),
)
