"""Thin wrappers around stock functions: they find the plan, then call the stock function.

* ``make_model_forward``: the multimodal ``*Model.forward``. Finds the plan for this call (the one
  ``prepare()`` registered for these tensors, the one of an enclosing ``generate()``, or one built
  after a single explicit read of the control tensors), makes it active, and runs the stock
  forward with the grids on the host (same values), so stock's own grid reads stay on the host.
* ``make_vision_forward``: the vision tower. Hands the stock forward the plan's precomputed
  tensors, which the stock helpers take from ``kwargs`` instead of deriving them from the grid.
* ``make_generate``: ``generate()`` of the ``*ForConditionalGeneration`` class, so the plan of a
  prepared batch reaches the prefill forward through ``generate``'s own copies of the inputs.
* ``make_get_rope_index``: the 3D rotary index, from the plan or computed without a sync.
* ``make_host_rope_index``: a family's own rotary index (``RotaryIndex.host_class``), from the plan (made by stock's own index
  on the host); without a plan, one read of its inputs, then stock's index on the host.
* ``make_ignore_causal_mask_sdpa``: Transformers' SDPA mask shortcut check, answered from the
  plan's host copy of the padding mask instead of reading the device.

Each wrapper keeps the stock signature (``functools.wraps`` sets ``__wrapped__``, which
``inspect.signature`` follows). While ``torch.compile`` traces, each goes straight to stock.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ..plan import active
from ..plan.batch import PLAN_KEY, Plan, build_plan, plan_inputs
from ..plan.checksum import assert_given_match
from ..plan.packing import FLASH_KWARGS
from ..plan.rope import rope_index
from ..plan.spec import ModelSpec, layout_of
from ..plan.tensors import move, same_host_values
from ..plan.vision import vision_plan
from .attention import AttentionChoice
from .buckets import run_bucketed
from .call_args import call_device, call_shape, fits, given_args, positional_names, same_device, taken_inputs
from .helpers import host_padding_mask, traced_vision_plan
from .host_read import read_to_host_syncs_once, send_plan_back
from .roles import TOWER, wrapper
from .segments import TracedSegments
from .vision_in_step import vision_in_step

__all__ = ["make_model_forward", "make_vision_forward", "make_vision_forward_device_grid",
           "make_vision_forward_seqlens_only", "make_generate", "make_get_rope_index", "make_host_rope_index",
           "make_ignore_causal_mask_sdpa", "make_per_sample_recurrent", "rope_index_wrapper", "planned_positions",
           "stock_index_on_host", "prepared_plan"]

# (and audio: an audio encoder's features, raw waveforms)
_VISION_INPUTS = ("pixel_values", "pixel_values_videos", "input_features", "input_values")
_FLAGS = ("use_audio_in_video",)  # how the tokens of a video with its audio are laid out (RotaryIndex.audio_class)


def _explicit_plan(plan: Plan, spec: ModelSpec, given: dict, shape) -> Plan:
    """A plan passed as ``syncfree_plan`` (``prepare(batch)`` without a device): check it still describes the call."""
    plan.check_model(spec)
    # A control tensor removed (or set to None) or added: stock would compute from the batch as given, the plan holds
    # what it made from the old one (3D positions from the old padding mask).
    plan.check_present(given)
    device = call_device(given)
    if device is not None and not same_device(plan.device, device) and plan.device == "cpu":
        # A plan built in a DataLoader worker whose batch was then moved by the training loop (as HF
        # Trainer moves it): its tensors follow, from pinned memory when the DataLoader pinned them.
        plan = plan.to(device)
    elif device is not None and not same_device(plan.device, device):
        raise ValueError(f"this syncfree plan was built for {plan.device} tensors but the inputs are on {device}; "
                         f"call syncfree.prepare(batch, {str(device)!r}) to move the batch and its plan together")
    if not fits(plan, shape):
        raise ValueError(f"this syncfree plan describes a batch of shape {plan.batch_shape} but the call has {shape}; "
                         "call syncfree.prepare() on the batch you pass")
    # More rows than planned: each row repeated (generate()'s expansion), which the checks below then prove.
    plan = plan.expanded(shape[0])
    for name in plan_inputs():  # host tensors: comparing them costs no sync
        value, kept = given.get(name), plan.host.get(name)
        if isinstance(value, torch.Tensor) and isinstance(kept, torch.Tensor) and value.device.type == "cpu" \
                and not same_host_values(value, kept):
            raise active.StalePlan(f"{name} differs from the batch its syncfree plan was built for; call "
                                   "syncfree.prepare() again on the changed batch")
    assert_given_match(plan, given)  # device tensors: compared on the device, without a wait
    return plan


def traced_entry(model, given: dict, explicit: Plan | None, taken) -> active.Entry | None:
    """The plan of a call that ``torch.compile`` traces, or None (stock's graph, breaks and all): the one passed as
    ``syncfree_plan``, else the one ``prepare(batch, device, model)`` attached to the very ``input_ids``. Dynamo guards
    on every plan value the graph reads, so a batch of another layout recompiles. The batch is checked inside the
    graph, as on the eager device path: control tensors added or removed at trace time, every tensor's values by its
    keyed checksum (host tensors too: a graph cannot compare them on the host), the model by its spec. Only for a
    family whose layout says its forward traces whole (``Layout.one_graph``); None for the others."""
    input_ids = given.get("input_ids")
    anchor = input_ids if input_ids is not None else given.get("mm_token_type_ids")
    plan = explicit if explicit is not None else active.attached(anchor)
    if plan is None:
        return None
    spec = spec_of(model)
    layout = layout_of(spec.model_type)
    if layout is None or not layout.one_graph:
        return None
    plan.check_model(spec)
    plan.check_present({**dict.fromkeys(taken), **given})  # (one the forward takes but the call leaves out is None)
    shape = call_shape(given)
    if shape is None or plan.shape != tuple(shape):
        raise ValueError(f"this syncfree plan describes a batch of shape {plan.batch_shape} but the call has {shape}; "
                         "call syncfree.prepare() on the batch you pass")
    assert_given_match(plan, given, host_too=True)
    entry = active.Entry(plan, input_ids, given.get("attention_mask"))
    entry.given = {n: given.get(n) for n in plan_inputs() if n in given}
    entry.pixels = {n: given[n] for n in ("pixel_values", "pixel_values_videos") if given.get(n) is not None}
    return entry


def spec_of(model) -> ModelSpec:
    """``ModelSpec.from_config(model.config)``; each eager call keeps it on the model, where a traced call reads it
    (a graph traced before any eager call traces ``from_config`` itself)."""
    if torch.compiler.is_compiling():
        kept = model.__dict__.get("_syncfree_spec")
        return kept if kept is not None else ModelSpec.from_config(model.config)
    spec = model.__dict__["_syncfree_spec"] = ModelSpec.from_config(model.config)
    return spec


def resolve(model, given: dict, explicit: Plan | None, taken=()) -> active.Entry | None:
    """The plan for one call of ``model`` (a ``*Model``) with arguments ``given``, or None (stock path).
    ``taken``: the control inputs the call takes (the forward's named parameters; every one for ``generate()``, which
    is handed the whole batch): one missing from ``given`` is None there, so a plan passed with the call (a carried
    plan) that was built from it is refused."""
    entry = _resolve(model, given, explicit, taken)
    if entry is not None:
        entry.given = {n: given.get(n) for n in plan_inputs() if n in given}
    return entry


def _resolve(model, given: dict, explicit: Plan | None, taken) -> active.Entry | None:
    # (ModelSpec is made only where a plan is checked or built: decode steps skip it.)
    shape = call_shape(given)
    input_ids, mask = given.get("input_ids"), given.get("attention_mask")
    if explicit is not None:
        return active.Entry(_explicit_plan(explicit, spec_of(model),
                                           {**dict.fromkeys(taken), **given}, shape), input_ids, mask)
    anchor = input_ids if input_ids is not None else given.get("mm_token_type_ids")
    registration = active.registered(anchor)
    if registration is not None:
        registration.plan.check_model(spec_of(model))
        # Every control input the forward takes counts, passed or not: one left out is None there (the inner *Model
        # called directly with the mask popped computes its positions from no mask; the plan made them from the mask).
        active.check_unchanged(registration, {**dict.fromkeys(taken), **given})
        assert_given_match(registration.plan, given)  # (edits that bump no version counter, e.g. via .data)
        return active.Entry(registration.plan, input_ids, mask)
    outer = active.generating()
    waiting = active.expected()
    if waiting is not None and outer is None and shape is not None and tuple(waiting.batch_shape) == tuple(shape):
        # A plan made for this call's batch by the caller that built it (planning_trainer's loss batches).
        return active.Entry(_explicit_plan(waiting, spec_of(model), given, shape), input_ids,
                            mask)
    device = call_device(given)
    if outer is not None and input_ids is not None and fits(outer.plan, shape) and device is not None \
            and same_device(outer.plan.device, device):
        # generate() copies, slices and expands the prepared tensors before the prefill forward.
        return active.Entry(outer.plan.expanded(shape[0]), input_ids, mask)
    encoded = given.get("mm_encoder_outputs")
    has_vision = any(given.get(n) is not None for n in _VISION_INPUTS) or bool(encoded)
    if input_ids is None and given.get("mm_token_type_ids") is None:
        return None
    if not has_vision and not (outer is None and device is not None and device.type != "cpu"
                               and isinstance(mask, torch.Tensor) and mask.dim() == 2):
        # Nothing to plan: no vision, or a decode step, or no 2D device mask whose checks would read it.
        return None
    # (A text-only micro-batch on the device with a padding mask: stock's mask code reads that mask
    # twice (the SDPA skip check; a recurrent-layer check, in a text model with such layers); one read here answers
    # both.)
    # No prepare(): read the small control tensors once (one wait), plan on the host, send the plan back.
    wanted = {n: given.get(n) for n in plan_inputs()}
    if not (isinstance(mask, torch.Tensor) and mask.dim() == 2):
        wanted["attention_mask"] = None  # 4D masks and per-layer dicts are not planned for (and not read)
        if mask is not None:
            # (With a mask of its own, e.g. generate()'s per-layer masks, stock reads no packed samples from the
            # positions, whose restarts are then the padding's: the plan reads none either.)
            wanted["position_ids"] = None
    host = read_to_host_syncs_once(wanted)
    spec = spec_of(model)
    flags = {"use_audio_in_video": bool(given.get("use_audio_in_video"))} if spec.rope.audio_class else {}
    plan = build_plan(spec, **host, **flags)
    return active.Entry(send_plan_back(plan, device) if device is not None else plan, input_ids, mask)


def _with_host_grids(names, args, kwargs, plan: Plan):
    """The call's arguments with the grids (and per-item merge sizes; a family's own grid inputs and
    host-only inputs, ``PlanHooks``) replaced by the plan's host copies (the same values)."""
    args = list(args)
    hosts = [(name, getattr(vp, field, None)) for name, vp, field in (
        ("image_grid_thw", plan.image, "grid_thw"), ("video_grid_thw", plan.video, "grid_thw"),
        ("image_merge_sizes", plan.image, "merge_sizes"), ("video_merge_sizes", plan.video, "merge_sizes"))]
    if plan.spec.hooks.tower_grid is not None:  # (the forward's grids are not all the tower's: hand it the given ones)
        hosts[0] = ("image_grid_thw", plan.host.get("image_grid_thw"))
    hooks = plan.spec.hooks  # (the family's own grids and host-only inputs, as host copies)
    hosts += [(name, plan.host.get(name)) for name in (*(hooks.grid_inputs or ()), *hooks.host_only)]
    for name, host in hosts:
        if host is None:
            continue
        if name in kwargs:
            if kwargs[name] is not None:
                kwargs[name] = host
        elif name in names and names.index(name) < len(args) and args[names.index(name)] is not None:
            args[names.index(name)] = host
    return tuple(args), kwargs


@wrapper("finds the batch's plan (prepare()'s, else one read of the control tensors) and runs stock with it, "
         'grids on the host')
def make_model_forward(stock):
    names = positional_names(stock)
    taken = taken_inputs(stock, plan_inputs())

    @functools.wraps(stock)
    def forward(self, *args, **kwargs):
        explicit = kwargs.pop(PLAN_KEY, None)
        if torch.compiler.is_compiling():
            entry = traced_entry(self, given_args(names, args, kwargs), explicit, taken)
            if entry is None:
                return stock(self, *args, **kwargs)
            with active.activate(entry):
                return stock(self, *args, **kwargs)
        given = given_args(names, args, kwargs)
        with vision_in_step(self, given):  # (only with patch(..., vision_every_step=True), in training)
            entry = resolve(self, given, explicit, taken)
            if entry is None:
                return stock(self, *args, **kwargs)
            if entry.plan.packing is not None and flash_like(check_packed_attention(self, entry.plan.spec)):
                # Flash attention's variable-length path, handed the plan's boundaries (it would find them from the
                # positions with a host read, and for a one-row batch only); the tower drops them (its own are its own).
                kwargs.update(entry.plan.packing.flash_kwargs())
            args, kwargs = _with_host_grids(names, args, kwargs, entry.plan)
            with active.activate(entry):
                return stock(self, *args, **kwargs)

    return forward


# The text attention implementations whose masks Transformers makes by ``_preprocess_mask_arguments`` (where the packed
# plan's boundaries are handed over) and that attend by that mask alone; and flash attention (``flash_like``), handed
# the boundaries as its variable-length arguments.
PACKED_ATTENTION = ("sdpa", "eager")


def flash_like(implementation) -> bool:
    """A flash attention implementation (Transformers' flash_attention_2/3, a hub kernel's), which takes
    ``cu_seq_lens_q`` and the rest (``Packing.flash_kwargs``) for a padding-free batch."""
    return isinstance(implementation, str) and "flash" in implementation and "flex" not in implementation


def check_packed_attention(model, spec: ModelSpec) -> str:
    """The text model's attention implementation; a packed batch refused for a family whose forward is not shown to
    keep its samples apart (``Layout.packing_refused``), and where the attention would not take the plan's boundaries
    (flex attention and others: not shown to)."""
    layout = layout_of(spec.model_type)
    if layout is None or layout.packing_refused:
        why = layout.packing_refused if layout is not None else "not a family syncfree supports"
        raise ValueError(f"syncfree refuses packed batches for {spec.model_type}: {why}")
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    implementation = getattr(text, "_attn_implementation", None)
    if implementation not in PACKED_ATTENTION and not flash_like(implementation):
        raise ValueError(f"syncfree refuses packed batches for a text model on {implementation!r} attention (it keeps "
                         f"packed samples apart with {', '.join(map(repr, PACKED_ATTENTION))} or flash attention); "
                         "load the model with attn_implementation=\"sdpa\"")
    return implementation


@wrapper('plans once for the whole generate() call')
def make_generate(stock):
    @functools.wraps(stock)
    def generate(self, *args, **kwargs):
        explicit = kwargs.pop(PLAN_KEY, None)
        given = {n: kwargs[n] for n in plan_inputs() + _VISION_INPUTS + _FLAGS + ("mm_encoder_outputs", "inputs_embeds")
                 if n in kwargs}
        inputs = args[0] if args else kwargs.get("inputs", kwargs.get("input_ids"))
        given["input_ids"] = inputs
        # Planned once for the whole call: generate() runs the vision encoder and the prefill on copies
        # of these tensors, which then find this plan (without prepare(): after one explicit read here).
        # The multimodal *Model (or, where a release has none, e.g. a family with an audio encoder before 5.2x, this
        # model itself).
        inner = getattr(self, "model", None)
        entry = resolve(inner if hasattr(getattr(inner, "config", None), "vision_config") else self, given, explicit,
                        taken=plan_inputs())
        if entry is None:
            return stock(self, *args, **kwargs)
        if entry.plan.packing is not None:
            raise ValueError("generate() got a packed batch (syncfree.packing_collator): its rows hold several "
                             "samples each, which generation cannot continue; generate from a padded batch")
        entry.in_generate = True
        _, kwargs = _with_host_grids((), (), kwargs, entry.plan)
        with active.activate(entry):
            return stock(self, *args, **kwargs)

    return generate


def _vision_plan_for(grid_thw):
    """The active plan's vision plan for this grid (the very host tensor, or equal host values)."""
    entry = active.current()
    if entry is None or not isinstance(grid_thw, torch.Tensor):
        return None
    for vp in (entry.plan.image, entry.plan.video, entry.plan.video_frames):
        if vp is not None and same_host_values(grid_thw, vp.grid_thw):
            return vp
    return None


def _patch_images(entry) -> bool:
    """Whether the traced call's family hands its tower patch images (``TowerShape.pixels_4d``)."""
    return entry is not None and entry.plan.spec.tower.pixels_4d


@wrapper("hands the stock tower the plan's segment sizes and tables, its grid on the device", TOWER)
def make_vision_forward_device_grid(stock):
    """``make_vision_forward`` for a tower that indexes its grid with device tensors (learned positions:
    ``image_shapes[seq_ids, 1]``): it is handed the plan's copy of the grid on the device."""
    return make_vision_forward(stock, device_grid=True)


@wrapper("hands the stock tower the plan's segment sizes (the grid is not read)", TOWER)
def make_vision_forward_seqlens_only(stock):
    """``make_vision_forward`` for a tower whose only stock helper is the attention's ``cu_seqlens`` (its positions
    are its own code): it is handed those, not the rotary ids (which would travel on, through its layers' ``**kwargs``, into the
    attention function, where flash attention reads ``position_ids``)."""
    return make_vision_forward(stock, seqlens_only=True)


@wrapper("hands the stock tower the plan's segment sizes and per-patch tables (the grid is not read)", TOWER)
def make_vision_forward(stock, device_grid: bool = False, seqlens_only: bool = False):
    names = positional_names(stock)
    first = names[0]  # the pixels ("hidden_states"; "pixel_values" in SigLIP-style towers), by position or name

    @functools.wraps(stock)
    def forward(self, *args, **kwargs):
        if args:
            hidden_states, args = args[0], args[1:]
        elif first in kwargs:
            hidden_states = kwargs.pop(first)
        else:
            return stock(self, *args, **kwargs)  # (stock's own error for the missing argument)
        vp = kwargs.pop("syncfree_vision_plan", None)
        entry = active.current()
        if entry is not None and entry.plan.packing is not None:
            for name in FLASH_KWARGS:  # (the text model's boundaries of a packed batch: not the tower's)
                kwargs.pop(name, None)
        given = given_args(names[1:], args, kwargs)
        grid_thw = given.get("grid_thw")
        args = args[1:] if args else args  # grid_thw is passed by keyword below
        kwargs.pop("grid_thw", None)
        if vp is None and torch.compiler.is_compiling():
            vp = traced_vision_plan(grid_thw)
            if vp is None:
                return stock(self, hidden_states, grid_thw, *args, **kwargs)
        if vp is None:
            vp = _vision_plan_for(grid_thw)
        if vp is None:
            if grid_thw is None:
                return stock(self, hidden_states, grid_thw, *args, **kwargs)
            host = read_to_host_syncs_once({"grid_thw": grid_thw})["grid_thw"]  # no read if already on the host
            vp = vision_plan(host, ModelSpec.for_vision_model(self))
        if not same_device(vp.device, hidden_states.device):
            vp = send_plan_back(vp, hidden_states.device)
        # Stock helpers pop these precomputed values from kwargs instead of deriving them from grid_thw,
        # so grid_thw is never read on the device (and may stay on the host).
        if buckets_ok and getattr(self, "_syncfree_buckets", None) and set(kwargs) <= {"return_dict"} and not args:
            # compile_vision(): one static graph per bucket
            return run_bucketed(self, hidden_states, vp, kwargs)
        traced = torch.compiler.is_compiling()
        # (traced: the tables sized by the pixels' own patch count and the segments handed over as host tensors,
        # sizes that Dynamo keeps dynamic, so the graph does not depend on the layout)
        # (a tower handed flattened patches, (patches, channels), as the M-RoPE families' towers are, or in a stream
        # patch images, (patches, C, P, P) or (1, patches, C, P, P); other layouts keep the plan's count)
        patches = hidden_states.shape[0] if traced and hidden_states.dim() == 2 else None
        if traced and vp.host_seqlens is not None and _patch_images(entry):
            if hidden_states.dim() == 4:
                patches = hidden_states.shape[0]
            elif hidden_states.dim() == 5 and hidden_states.shape[0] == 1:
                patches = hidden_states.shape[1]
        extra = vp.seqlen_kwargs(traced) if seqlens_only else vp.vision_kwargs(patches, traced)
        if traced and vp.host_seqlens is not None:
            full = (vp.host_seqlens, lambda: vp.seqlens_by_length()[len(vp.seqlens) + 1])
            extra["syncfree_seqlens"] = TracedSegments(
                [(vp.cu_seqlens, *full)]
                + ([(vp.cu_window_seqlens, vp.host_window_seqlens, lambda: vp.window_seqlens)] if vp.has_windows
                   else []), vp.seqlens_by_length,
                derived=full if vp.segment_prefix and not vp.has_windows else None)
        backend = getattr(self, "_syncfree_attention", None)  # set by patch(..., vision_attention=...)
        if backend is not None and backend != "split":
            extra["syncfree_attention"] = AttentionChoice(backend)
        # (a traced forward keeps the call's own grid: rewritten stock code finds its plan by identity)
        grid = grid_thw if torch.compiler.is_compiling() and grid_thw is not None else (
            vp.device_grid if device_grid else vp.grid_thw)
        return stock(self, hidden_states, *args, grid_thw=grid, **{**extra, **kwargs})

    # compile_vision's padded buckets hand the stock forward the host grid and every table: not for these towers.
    buckets_ok = not (device_grid or seqlens_only)
    forward.syncfree_buckets_ok = buckets_ok
    return forward


@wrapper("runs a packed batch's samples through the recurrent layer one by one (its state starts afresh at each)")
def make_per_sample_recurrent(stock):
    """A linear-attention (gated-DeltaNet) layer's forward, ``forward(self, hidden_states, cache=None,
    attention_mask=None, **kwargs)``: in the forward of a packed batch, each segment of each row (each sample, the row's
    padding) goes through the stock layer alone, from a zero state and a zero convolution window, as it would in its own
    run; the outputs are put back in place. By the plan's host lengths: slices and one concatenation, no read. Any other
    call is stock's."""
    names = positional_names(stock)

    @functools.wraps(stock)
    def forward(self, *args, **kwargs):
        entry = None if torch.compiler.is_compiling() else active.current()
        packing = entry.plan.packing if entry is not None else None
        given = given_args(names, args, kwargs)
        hidden_states = given.get("hidden_states")
        if packing is None or not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 3 \
                or tuple(hidden_states.shape[:2]) != tuple(packing.batch_shape) or given.get("attention_mask") is not None:
            return stock(self, *args, **kwargs)
        extra = {k: v for k, v in kwargs.items() if k not in ("hidden_states", "cache", "cache_params",
                                                               "attention_mask", *FLASH_KWARGS)}
        rows = []
        for r, lengths in enumerate(packing.rows):
            pieces = torch.split(hidden_states[r:r + 1], list(lengths), dim=1)
            rows.append(torch.cat([stock(self, piece, **extra) for piece in pieces], dim=1))
        return torch.cat(rows, dim=0)

    return forward


def rope_index_wrapper(stock, answer: Callable):
    """The ``get_rope_index`` every rotary index wrapper factory returns: stock's signature, the call's inputs by name
    (``given``), and ``answer(self, given, call_stock)`` for the positions and deltas, where ``call_stock()`` is stock's
    own index on the call as it was made."""
    names = positional_names(stock)

    @functools.wraps(stock)
    def get_rope_index(self, *args, **kwargs):
        return answer(self, given_args(names, args, kwargs), lambda: stock(self, *args, **kwargs))

    return get_rope_index


def planned_positions(entry, input_ids, mask):
    """The active plan's (positions, deltas) where this call is its forward's (its ids, its attention mask) and the
    plan holds positions, else None."""
    if entry is not None and entry.owns(input_ids) and mask is entry.attention_mask \
            and entry.plan.position_ids is not None:
        return entry.plan.position_ids, entry.plan.rope_deltas
    return None


def stock_index_on_host(stock, self, given: dict) -> tuple:
    """No plan for these inputs: one read of ``given`` (the index's inputs), stock's index on the host (the same
    numbers), its positions and deltas sent back to the input ids' device without a wait."""
    input_ids = given.get("input_ids")
    device = input_ids.device if isinstance(input_ids, torch.Tensor) else None
    positions, deltas = stock(self, **read_to_host_syncs_once(given))
    return move(positions, device), move(deltas, device)


@wrapper("syncfree's 3D rotary index: whole-tensor ops, no host read")
def make_get_rope_index(stock):
    def answer(self, given, call_stock):
        input_ids, mask = given.get("input_ids"), given.get("attention_mask")
        # (in a traced forward, the plan's positions too: graph inputs whose shapes follow the batch, where the index
        # computed in the graph would be sized by the grid's values)
        entry = active.current()
        if entry is not None and entry.owns(input_ids) and entry.plan.stock_rope:
            return call_stock()  # a batch only stock's own index answers as stock does
        planned = planned_positions(entry, input_ids, mask)
        if planned is not None:
            return planned
        options = ModelSpec.from_config(self.config).rope_options(given.get("second_per_grid_ts"))
        return rope_index(input_ids, given.get("mm_token_type_ids"), given.get("image_grid_thw"),
                          given.get("video_grid_thw"), mask, **options)

    return rope_index_wrapper(stock, answer)


def prepared_plan(given: dict, names) -> Plan | None:
    """The plan prepare() registered for the call's input_ids, when every input of the index (each parameter it
    names, passed or not) is the one prepare() returned, unchanged, and the plan holds positions."""
    registration = active.registered(given.get("input_ids"))
    if registration is None or registration.plan.position_ids is None or registration.plan.stock_rope:
        return None
    try:
        active.check_unchanged(registration, {n: given.get(n) for n in names if n in plan_inputs()})
    except active.StalePlan:
        return None
    return registration.plan


@wrapper("the plan's multimodal positions (the family's own stock index, run on the host copies)")
def make_host_rope_index(stock):
    names = positional_names(stock)

    def answer(self, given, call_stock):
        input_ids, mask = given.get("input_ids"), given.get("attention_mask")
        # The plan's positions are made for the config's downsample mode (a family's index that takes a per-call one):
        # for another, no plan answers.
        planned = given.get("downsample_mode") in (None, getattr(self.config, "downsample_mode", None))
        entry = active.current() if planned else None
        if entry is not None and entry.owns(input_ids) and entry.plan.stock_rope:
            return call_stock()  # inputs stock's index refuses: its own error, from the device
        found = planned_positions(entry, input_ids, mask)
        if found is not None:
            return found
        if torch.compiler.is_compiling():  # (a traced forward without its plan's inputs: stock's graph)
            return call_stock()
        plan = prepared_plan(given, names) if entry is None and planned else None
        if plan is not None:  # called on a prepared batch outside a forward
            return plan.position_ids, plan.rope_deltas
        # (the index's own parameters: callers may pass more, e.g. the pixels, in its **kwargs)
        return stock_index_on_host(stock, self, {n: given[n] for n in names if n in given})

    return rope_index_wrapper(stock, answer)


@wrapper("answers 'is the padding mask all ones?' from the plan's host copy")
def make_ignore_causal_mask_sdpa(stock):
    is_tracing = stock.__globals__.get("is_tracing")

    @functools.wraps(stock)
    def _ignore_causal_mask_sdpa(padding_mask, *args, **kwargs):
        entry = None if torch.compiler.is_compiling() else active.current()
        if (entry is not None and isinstance(padding_mask, torch.Tensor) and padding_mask.device.type != "cpu"
                and not (is_tracing is not None and is_tracing(padding_mask))):
            # The padding mask of this forward, derived from the attention mask the plan holds a host copy
            # of: stock's all-ones checks give the same answer on the host, without a wait.
            host = host_padding_mask(entry, padding_mask)
            if host is not None:
                padding_mask = host.bool()  # stock has turned the mask into booleans by now
        return stock(padding_mask, *args, **kwargs)

    return _ignore_causal_mask_sdpa

