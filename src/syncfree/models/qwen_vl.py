"""Sync-free replacements for Qwen-VL models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE share this code).

Each ``make_*`` takes the stock function it replaces and returns the replacement.
Where stock code is already sync-free once it is handed host-side values, the
replacement calls the stock function with those values (the vision tower: its
helpers take precomputed tensors); where the sync is in the body, the body is
rewritten with the same arithmetic (vision attention's split, the feature and
deepstack merge, the M-RoPE index).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys

import torch

from ..host_read import read_to_host_syncs_once
from ..plan import ModelSpec, Plan, build_plan, vision_plan
from ..rope import rope_index

__all__ = ["make_attention_forward", "make_vision_forward", "make_model_forward", "make_get_rope_index",
           "make_deepstack_process", "make_generation_forward"]


def _module_of(obj):
    return sys.modules[type(obj).__module__]


# ---- vision attention: split by host sizes ----------------------------------------------------------
def make_attention_forward(stock):
    @functools.wraps(stock)
    def forward(self, hidden_states, cu_seqlens, position_embeddings=None, max_seqlen=None, syncfree_seqlens=None,
                **kwargs):
        m = _module_of(self)
        if syncfree_seqlens is None or m.is_flash_attention_requested(self.config):
            # The flash/varlen path needs only cu_seqlens (on the device) and max_seqlen (a host int).
            return stock(self, hidden_states, cu_seqlens=cu_seqlens, position_embeddings=position_embeddings,
                         max_seqlen=max_seqlen, **kwargs)
        seq_length = hidden_states.shape[0]
        q, k, v = self.qkv(hidden_states).reshape(seq_length, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        cos, sin = position_embeddings
        q, k = m.apply_rotary_pos_emb_vision(q, k, cos, sin)
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        attention = m.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, m.eager_attention_forward)
        # The segment lengths are Python ints from the plan: no per-layer read of cu_seqlens. Models
        # with window attention alternate two segmentations; the plan keys them by cu_seqlens' length.
        sizes = syncfree_seqlens[cu_seqlens.shape[0]] if isinstance(syncfree_seqlens, dict) else syncfree_seqlens
        splits = [torch.split(t, list(sizes), dim=2) for t in (q, k, v)]
        outputs = [
            attention(self, qi, ki, vi, attention_mask=None, scaling=self.scaling,
                      dropout=0.0 if not self.training else self.attention_dropout, is_causal=False, **kwargs)[0]
            for qi, ki, vi in zip(*splits)
        ]
        out = torch.cat(outputs, dim=1).reshape(seq_length, -1).contiguous()
        return self.proj(out)

    return forward


# ---- vision tower: hand the stock forward a host-made plan -----------------------------------------
def make_vision_forward(stock):
    @functools.wraps(stock)
    def forward(self, hidden_states, grid_thw=None, syncfree_vision_plan=None, **kwargs):
        plan = syncfree_vision_plan
        if plan is None:
            if grid_thw is None:
                raise ValueError("the vision tower needs grid_thw (or a syncfree plan)")
            host_grid = read_to_host_syncs_once({"grid_thw": grid_thw})["grid_thw"]
            plan = vision_plan(host_grid, ModelSpec.for_vision_model(self)).to(hidden_states.device)
        # Stock helpers pop these precomputed values from kwargs instead of deriving them from grid_thw,
        # so grid_thw is never read on the device (and may stay on the host).
        return stock(self, hidden_states, grid_thw=plan.grid_thw, **{**plan.vision_kwargs(), **kwargs})

    return forward


# ---- the M-RoPE index ---------------------------------------------------------------------------------
def make_get_rope_index(stock):
    @functools.wraps(stock)
    def get_rope_index(self, input_ids, mm_token_type_ids, image_grid_thw=None, video_grid_thw=None,
                       attention_mask=None, **kwargs):
        plan = kwargs.get("syncfree_plan")
        if isinstance(plan, Plan) and input_ids.shape[1] == plan.batch_shape[1]:
            plan = plan.expanded(input_ids.shape[0])
            if plan.position_ids is not None:
                return plan.position_ids, plan.rope_deltas
        options = ModelSpec.from_config(self.config).rope_options(kwargs.get("second_per_grid_ts"))
        return rope_index(input_ids, mm_token_type_ids, image_grid_thw, video_grid_thw, attention_mask, **options)

    return get_rope_index


# ---- deepstack: add features at index positions ------------------------------------------------------
def make_deepstack_process(stock):
    @functools.wraps(stock)
    def _deepstack_process(self, hidden_states, visual_pos_masks, visual_embeds):
        if visual_pos_masks.dtype == torch.bool:
            # The number of true positions is known on the host: visual_embeds has one row each.
            positions = torch.nonzero_static(visual_pos_masks.reshape(-1), size=visual_embeds.shape[0]).flatten()
        else:
            positions = visual_pos_masks.to(hidden_states.device)
        visual_embeds = visual_embeds.to(hidden_states.device, hidden_states.dtype)
        hidden_states = hidden_states.clone()
        flat = hidden_states.view(-1, hidden_states.shape[-1])
        flat.index_copy_(0, positions, flat.index_select(0, positions) + visual_embeds)
        return hidden_states

    return _deepstack_process


# ---- the generation model: let generate() pass the plan along ------------------------------------------
def make_generation_forward(stock):
    """Stock forward, with ``syncfree_plan`` in its signature: generate() checks kwargs against it."""
    import inspect

    signature = inspect.signature(stock)
    params = list(signature.parameters.values())
    plan_param = inspect.Parameter("syncfree_plan", inspect.Parameter.KEYWORD_ONLY, default=None)
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    params.insert(at, plan_param)

    @functools.wraps(stock)
    def forward(self, *args, syncfree_plan=None, **kwargs):
        if syncfree_plan is not None:
            kwargs["syncfree_plan"] = syncfree_plan
        return stock(self, *args, **kwargs)

    forward.__signature__ = signature.replace(parameters=params)
    return forward


# ---- the multimodal model forward ---------------------------------------------------------------------
def _plan_for(model, syncfree_plan, input_ids, mm_token_type_ids, attention_mask, image_grid_thw, video_grid_thw,
              second_per_grid_ts, pixel_values, pixel_values_videos, device) -> Plan:
    # generate() may encode the pixels itself and hand over only the features (mm_encoder_outputs),
    # dropping the grids: the plan then places features by their tokens alone.
    grids_optional = pixel_values is None and pixel_values_videos is None
    spec = ModelSpec.from_config(model.config)
    if syncfree_plan is not None:
        syncfree_plan.check_model(spec)
        rows = (input_ids if input_ids is not None else mm_token_type_ids).shape[0]
        return syncfree_plan.expanded(rows)
    # No prepare(): read the small control tensors once, build the plan, send it back.
    host = read_to_host_syncs_once({"input_ids": input_ids, "mm_token_type_ids": mm_token_type_ids,
                                    "attention_mask": attention_mask, "image_grid_thw": image_grid_thw,
                                    "video_grid_thw": video_grid_thw, "second_per_grid_ts": second_per_grid_ts})
    # Of the pixels only the shapes are checked: they are host metadata, nothing is read.
    return build_plan(spec, pixel_values=pixel_values, pixel_values_videos=pixel_values_videos,
                      grids_optional=grids_optional, **host).to(device)


def _output_class(stock_forward):
    source = _source(stock_forward)
    names = re.findall(r"return\s+(\w+)\(", source)
    if not names:
        raise RuntimeError("cannot find the output class of the stock forward")
    return getattr(sys.modules[stock_forward.__module__], names[-1])


def _source(fn) -> str:
    import inspect

    return inspect.getsource(inspect.unwrap(fn))


def _cat(features):
    return torch.cat(features, dim=0) if isinstance(features, (tuple, list)) else features


def make_model_forward(stock):
    output_class = _output_class(stock)
    fields = {f.name for f in dataclasses.fields(output_class)}
    generic = sys.modules["transformers.utils.generic"]
    stock_params = _parameters_of(stock)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, pixel_values=None,
                pixel_values_videos=None, image_grid_thw=None, video_grid_thw=None, mm_token_type_ids=None,
                mm_encoder_outputs=None, syncfree_plan=None, **kwargs):
        cache = kwargs.pop("cache", None)
        legacy_cache = kwargs.pop("past_key_values", None)
        cache = cache if cache is not None else legacy_cache
        # Arguments the stock forward names go where stock sends them, not on to the vision tower.
        second_per_grid_ts = kwargs.pop("second_per_grid_ts", None)
        text_kwargs = {"use_cache": kwargs.pop("use_cache")} if "use_cache" in stock_params and "use_cache" in kwargs \
            else {}
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if (pixel_values is not None or pixel_values_videos is not None) and mm_encoder_outputs is not None:
            raise ValueError(
                "You cannot specify both pixel_values/pixel_values_videos and mm_encoder_outputs at the same time")
        if inputs_embeds is None:
            inputs_embeds = self.get_input_embeddings()(input_ids)
        encoder = dict(mm_encoder_outputs or {})
        has_vision = pixel_values is not None or pixel_values_videos is not None or bool(encoder)
        plan = None
        if has_vision:
            if input_ids is None and mm_token_type_ids is None:
                raise ValueError("syncfree's patched forward needs input_ids or mm_token_type_ids to place "
                                 "multimodal features without a host sync")
            plan = _plan_for(self, syncfree_plan, input_ids, mm_token_type_ids, attention_mask, image_grid_thw,
                             video_grid_thw, second_per_grid_ts, pixel_values, pixel_values_videos,
                             inputs_embeds.device)
        if pixel_values is not None and encoder.get("image") is None:
            encoder["image"] = self.get_image_features(pixel_values, plan.image.grid_thw, return_dict=True,
                                                       syncfree_vision_plan=plan.image, **kwargs)
        if pixel_values_videos is not None and encoder.get("video") is None:
            encoder["video"] = self.get_video_features(pixel_values_videos, plan.video.grid_thw, return_dict=True,
                                                       syncfree_vision_plan=plan.video, **kwargs)

        deepstack = {}
        for kind, token_id, count in (("image", self.config.image_token_id, plan and plan.n_image_tokens),
                                      ("video", self.config.video_token_id, plan and plan.n_video_tokens)):
            if encoder.get(kind) is None:
                continue
            embeds = _cat(encoder[kind].pooler_output).to(inputs_embeds.device, inputs_embeds.dtype)
            if embeds.shape[0] != count:  # host ints on both sides: the check costs no sync
                raise ValueError(f"{kind.capitalize()} features and {kind} tokens do not match, tokens: {count}, "
                                 f"features: {embeds.shape[0]}")
            if input_ids is not None:
                mask = (input_ids == token_id).unsqueeze(-1)
            else:
                mask = (mm_token_type_ids == (1 if kind == "image" else 2)).unsqueeze(-1).to(inputs_embeds.device)
            inputs_embeds = inputs_embeds.masked_scatter(mask, embeds)
            if getattr(encoder[kind], "deepstack_features", None) is not None:  # Qwen3-VL
                deepstack[kind] = [_cat(f) for f in encoder[kind].deepstack_features]

        visual_positions = deepstack_embeds = None
        if deepstack:
            visual_positions = plan.visual_positions
            if len(deepstack) == 2:
                deepstack_embeds = []
                for image_level, video_level in zip(deepstack["image"], deepstack["video"]):
                    joint = image_level.new_zeros(plan.n_image_tokens + plan.n_video_tokens, image_level.shape[-1])
                    joint.index_copy_(0, plan.image_in_visual, image_level)
                    joint.index_copy_(0, plan.video_in_visual, video_level)
                    deepstack_embeds.append(joint)
            else:
                (deepstack_embeds,) = deepstack.values()

        cache_length = 0 if cache is None else cache.get_seq_length()
        cache_name = "cache" if "cache" in _parameters(self.language_model.forward) else "past_key_values"
        if position_ids is None:
            if plan is not None and plan.position_ids is not None and cache_length == 0:
                position_ids, self.rope_deltas = plan.position_ids, plan.rope_deltas
            else:
                extra = {"second_per_grid_ts": second_per_grid_ts} if second_per_grid_ts is not None else {}
                position_ids = self.compute_3d_position_ids(
                    input_ids=input_ids, image_grid_thw=image_grid_thw, video_grid_thw=video_grid_thw,
                    inputs_embeds=inputs_embeds, attention_mask=attention_mask, mm_token_type_ids=mm_token_type_ids,
                    **{cache_name: cache}, **extra,
                )
        text_mask = _text_attention_mask(self.language_model, plan, attention_mask, inputs_embeds, cache,
                                         cache_length, position_ids)
        if visual_positions is not None:
            text_kwargs.update(visual_pos_masks=visual_positions, deepstack_visual_embeds=deepstack_embeds)
        outputs = self.language_model(
            input_ids=None, position_ids=position_ids, attention_mask=text_mask, inputs_embeds=inputs_embeds,
            **{cache_name: cache}, **text_kwargs, **kwargs,
        )
        extras = {"rope_deltas": self.rope_deltas, "image_outputs": encoder.get("image"),
                  "video_outputs": encoder.get("video")}
        return output_class(**outputs, **{k: v for k, v in extras.items() if k in fields})

    forward.__doc__ = stock.__doc__
    forward.__wrapped_stock__ = stock
    return generic.can_return_tuple(forward)


@functools.lru_cache(maxsize=None)
def _parameters_of(fn) -> frozenset:
    import inspect

    return frozenset(inspect.signature(fn).parameters)


def _parameters(bound) -> frozenset:
    return _parameters_of(getattr(bound, "__func__", bound))


def _text_attention_mask(language_model, plan, attention_mask, inputs_embeds, cache, cache_length, position_ids):
    """The mask to hand the text model, decided on the host where stock would read the device.

    In a prefill with SDPA, stock checks on the device whether the 2D padding mask is all ones, to
    drop the mask and use SDPA's is_causal. The plan knows the answer: all ones -> no mask (what
    stock ends up with); padding -> the same 4D mask stock builds, made without the skip check.
    """
    if plan is None or attention_mask is None or attention_mask.dim() != 2 or cache_length != 0:
        return attention_mask
    if position_ids is None:  # the text model makes its own positions; leave the mask to it
        return attention_mask
    text_position_ids = position_ids[0] if position_ids.dim() == 3 and position_ids.shape[0] == 4 else None
    if plan.padding_free and (text_position_ids is None or cache is not None):
        # (Without a mask, cache and text positions, the mask code would look for packed sequences.)
        return None
    if language_model.config._attn_implementation != "sdpa" or getattr(language_model, "has_sliding_layers", False):
        return attention_mask
    if plan.padding_free:
        return attention_mask
    masking = sys.modules[type(language_model).__module__].create_causal_mask
    cache_name = "cache" if "cache" in _parameters_of(masking) else "past_key_values"
    return masking(config=language_model.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                   position_ids=text_position_ids, allow_is_causal_skip=False, **{cache_name: cache})
