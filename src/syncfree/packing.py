"""``packing_collator``: padding-free multimodal batches, each row several samples end to end, planned where collated.

Padding a batch of samples of 16 to 512 tokens to its longest wastes most of its tokens. The packing collator lays
the samples end to end instead, in rows of at most ``max_tokens`` (in the order given, a row filled before the next
starts), and returns what the patched model takes: the tokens, pixels and grids concatenated in that order, each
sample's own positions (the family's rotary index restarted per sample, as it would run alone; the text row first,
then the 3D rows), labels whose first token of each sample is ``-100`` (no sample learns from the one before it), and
the plan with the samples' boundaries (``Plan.packing``). The patched forward keeps the samples apart where stock
would let attention cross them (``plan/packing.py``), so each sample's logits are those of the sample run alone.

Like ``planning_collator`` it runs in ``DataLoader`` workers (no CUDA there; it pickles with the model's plan values,
not the model) and its batch carries its plan under ``"syncfree_plan"``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .plan.batch import PLAN_KEY, Plan
from .plan.packing import packing_of, rows_of
from .plan.spec import ModelSpec, multimodal_config
from .prepare import model_spec, plan_batch

__all__ = ["PackingCollator", "packing_collator"]

# What a sample (one processor output, batch dim 1) may hold, by how it packs: along the tokens of a row, or one entry
# per image or video, concatenated in packed order.
_TOKENS = ("input_ids", "attention_mask", "mm_token_type_ids", "labels")
_ITEMS = {"pixel_values": "image", "image_grid_thw": "image", "pixel_values_videos": "video",
          "video_grid_thw": "video", "second_per_grid_ts": "video"}
_ORDERS = ("given", "first_fit")


class PackingCollator:
    """A data collator packing per-sample processor outputs into padding-free rows, with the plan. Picklable: it keeps
    the model's plan values (a ``ModelSpec``) and a few ints, not the model."""

    def __init__(self, spec: ModelSpec, max_tokens: int, order: str, pad_token_id: int, pixel_width: int | None,
                 model_type: str) -> None:
        self.spec, self.max_tokens, self.order = spec, max_tokens, order
        self.pad_token_id, self.pixel_width, self.model_type = pad_token_id, pixel_width, model_type

    def __repr__(self) -> str:
        return f"PackingCollator({self.model_type}, max_tokens={self.max_tokens}, order={self.order!r})"

    def __call__(self, features: list) -> dict:
        try:
            return self._collate(features)
        except ValueError as err:
            raise ValueError(f"syncfree.packing_collator: {err}") from err

    def _collate(self, features: list) -> dict:
        if not isinstance(features, (list, tuple)) or not features:
            raise ValueError(f"takes a non-empty list of samples (processor outputs), got {type(features).__name__}")
        first = {k: v for k, v in features[0].items() if v is not None} if isinstance(features[0], Mapping) else None
        samples = [self._sample(i, f, first) for i, f in enumerate(features)]
        with_labels = [s["labels"] is not None for s in samples]
        if any(with_labels) and not all(with_labels):
            raise ValueError(f"sample {with_labels.index(not with_labels[0])} {'has' if with_labels[0] else 'lacks'} "
                             f"labels where sample 0 {'lacks' if with_labels[0] else 'has'} them; give all or none")
        spec = self.spec
        if spec.video.frames_as_images and spec.video_span_ids is None:
            # (stock counts video frames as image placeholders: a batch with both fails its feature check)
            kinds = [("image_grid_thw" in s) + 2 * ("video_grid_thw" in s) for s in samples]
            if any(k & 1 for k in kinds) and any(k & 2 for k in kinds):
                image, video = next(i for i, k in enumerate(kinds) if k & 1), next(i for i, k in enumerate(kinds) if k & 2)
                raise ValueError(f"sample {image} has images and sample {video} a video, and {self.model_type}'s forward "
                                 "takes no batch with both (it counts video frames as image placeholders); pack them "
                                 "in separate batches")
        lengths = [s["length"] for s in samples]
        rows = rows_of(lengths, self.max_tokens, first_fit=self.order == "first_fit")
        order = [i for row in rows for i in row]
        width = max(sum(lengths[i] for i in row) for row in rows)
        packing = packing_of([[lengths[i] for i in row] for row in rows], order, width)
        batch = self._layout(samples, rows, width)
        batch[PLAN_KEY] = plan_batch(batch, self.spec, packing=packing)
        return batch

    def _sample(self, i: int, sample, first) -> dict:
        """One sample's tensors, checked (``ValueError`` naming the sample), with its own positions."""
        if not isinstance(sample, Mapping):
            raise ValueError(f"sample {i} is a {type(sample).__name__}, not a processor output (a dict of tensors)")
        sample = {k: v for k, v in sample.items() if v is not None}  # (a dataset row's absent inputs are None)
        for name, value in sample.items():
            if name not in _TOKENS and name not in _ITEMS:
                raise ValueError(f"sample {i} holds {name!r}, which the packing collator does not know how to pack "
                                 f"(it packs {', '.join(_TOKENS + tuple(_ITEMS))})")
            if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                raise ValueError(f"sample {i}'s {name} is on {value.device}; pack the processor's CPU tensors (move the "
                                 "packed batch, or let the training loop move it)")
        ids = sample.get("input_ids")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
            raise ValueError(f"sample {i}'s input_ids must be a tensor of shape (1, tokens), got "
                             f"{tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__}")
        length = ids.shape[1]
        for name in ("attention_mask", "mm_token_type_ids", "labels"):
            value = sample.get(name)
            if value is not None and (not isinstance(value, torch.Tensor) or tuple(value.shape) != (1, length)):
                raise ValueError(f"sample {i}'s {name} must have input_ids' shape (1, {length}), got "
                                 f"{tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__}")
        mask = sample.get("attention_mask")
        if mask is not None and not bool((mask == 1).all()):
            raise ValueError(f"sample {i} has padding (zeros in its attention_mask); give each sample unpadded")
        self._same_family(i, sample, first)
        if length > self.max_tokens:
            raise ValueError(f"sample {i} has {length} tokens, more than max_tokens={self.max_tokens}")
        inputs = {n: v for n, v in sample.items() if n != "labels"}
        try:
            plan = plan_batch(inputs, self.spec)
        except ValueError as err:
            raise ValueError(f"sample {i}: {err}") from err
        return {**inputs, "labels": sample.get("labels"), "length": length, "positions": _positions(plan, length)}

    def _same_family(self, i: int, sample, first) -> None:
        """Refuse a sample that another family's processor made (where its tensors can tell)."""
        for name in ("pixel_values", "pixel_values_videos"):
            pixels = sample.get(name)
            if isinstance(pixels, torch.Tensor) and self.pixel_width is not None and pixels.dim() == 2 \
                    and pixels.shape[-1] != self.pixel_width:
                raise ValueError(f"sample {i}'s {name} rows have {pixels.shape[-1]} values but {self.model_type}'s "
                                 f"patches have {self.pixel_width}: samples of another family's processor?")
        for name in ("mm_token_type_ids",):
            if (name in sample) != (name in first):
                raise ValueError(f"sample {i} {'has' if name in sample else 'lacks'} {name} where sample 0 "
                                 f"{'lacks' if name in sample else 'has'} it: samples of two families' processors?")
        if "video_grid_thw" in sample and "video_grid_thw" in first and \
                ("second_per_grid_ts" in sample) != ("second_per_grid_ts" in first):
            raise ValueError(f"sample {i}'s video {'has' if 'second_per_grid_ts' in sample else 'lacks'} "
                             "second_per_grid_ts where sample 0's has "
                             f"{'none' if 'second_per_grid_ts' in sample else 'one'}: samples of two families' "
                             "processors?")

    def _layout(self, samples: list[dict], rows: list[list[int]], width: int) -> dict:
        """The packed batch: rows of samples end to end, padded at their ends; items concatenated in packed order."""
        n_rows = len(rows)
        first = samples[0]
        ids = torch.full((n_rows, width), self.pad_token_id, dtype=first["input_ids"].dtype)
        labels = torch.full((n_rows, width), -100, dtype=torch.long)
        positions = torch.zeros((4, n_rows, width), dtype=torch.long)
        types = torch.zeros((n_rows, width), dtype=first["mm_token_type_ids"].dtype) \
            if "mm_token_type_ids" in first else None
        for r, row in enumerate(rows):
            start = 0
            for i in row:
                s, n = samples[i], samples[i]["length"]
                ids[r, start:start + n] = s["input_ids"][0]
                if types is not None:
                    types[r, start:start + n] = s["mm_token_type_ids"][0]
                own = s["labels"][0] if s["labels"] is not None else s["input_ids"][0]
                labels[r, start:start + n] = own
                labels[r, start] = -100  # (its first token follows another sample's last: nothing to learn there)
                positions[0, r, start:start + n] = torch.arange(n)
                positions[1:, r, start:start + n] = s["positions"]
                start += n
            if start < width:  # the row's padding: a segment of its own, positions restarted
                positions[:, r, start:] = torch.arange(width - start)
        batch = {"input_ids": ids}
        if types is not None:
            batch["mm_token_type_ids"] = types
        batch["position_ids"] = positions
        order = [i for row in rows for i in row]
        for name in _ITEMS:
            parts = [samples[i][name] for i in order if samples[i].get(name) is not None]
            if parts:
                batch[name] = torch.cat(parts)
        batch["labels"] = labels
        # (A training forward needs no cache. Without one, Transformers' own packed-sequence masks also keep the samples
        # apart in a model that is not patched (with a cache it attends across them); the patched one does either way.)
        batch["use_cache"] = False
        return batch


def _positions(plan: Plan, length: int) -> torch.Tensor:
    """A sample's 3D positions (3, length), as its forward alone makes them: the plan's (the family's index), else
    0..length-1 (a text-only sample: stock numbers its tokens so)."""
    if plan.stock_rope:
        raise ValueError("its placeholder runs do not match its grids, so its positions are only stock's to make")
    if plan.position_ids is None:
        return torch.arange(length).expand(3, length)
    return torch.as_tensor(plan.position_ids)[:, 0].to(torch.long)


def packing_collator(model, max_tokens: int, *, order: str = "given", pad_token_id: int | None = None) -> PackingCollator:
    """A data collator (HF ``Trainer``/TRL's ``data_collator``, a ``DataLoader``'s ``collate_fn``) that packs a list of
    per-sample processor outputs (dicts of CPU tensors, batch dim 1, optional ``labels``) padding-free into rows of at
    most ``max_tokens`` tokens, with the plan the patched ``model`` reads.

    ``order="given"`` packs the samples in the order given, each row filled before the next starts; ``"first_fit"``
    puts each into the first row with room (fewer, fuller rows; the given order kept within a row). Rows shorter than
    the longest end in padding (``pad_token_id``, default the text config's, else 0), labelled ``-100``. The model
    must be patched and of a family whose patched forward keeps packed samples apart; any other is refused here, in
    one line naming the family and why."""
    from .patching import packing_refusal

    refusal = packing_refusal(model)
    if refusal is not None:
        raise ValueError(refusal)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"syncfree.packing_collator: max_tokens must be a positive int, got {max_tokens!r}")
    if order not in _ORDERS:
        raise ValueError(f"syncfree.packing_collator: order must be one of {_ORDERS}, got {order!r}")
    spec = model_spec(model, {})
    config = spec.config if spec.config is not None else multimodal_config(model)
    text = getattr(config, "text_config", config)
    if pad_token_id is None:
        pad_token_id = getattr(text, "pad_token_id", None)
        pad_token_id = 0 if pad_token_id is None else int(pad_token_id)
    vc = getattr(config, "vision_config", None)
    width = None
    if vc is not None and all(hasattr(vc, a) for a in ("in_channels", "patch_size", "temporal_patch_size")):
        width = int(vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2)
    return PackingCollator(spec, max_tokens, order, pad_token_id, width, config.model_type)
