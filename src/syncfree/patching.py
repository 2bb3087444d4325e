"""``patch`` / ``unpatch``: apply the family table to a model instance or to the classes, and undo it.

Before anything is replaced, every target of the family is checked against the installed
Transformers (the lines an edit rewrites must be there exactly as expected; a wrapper's stock
function must take the parameters and contain the code it relies on). One mismatch and nothing
is patched: syncfree refuses with a message naming the version and the function.

Instance patches are bound methods in the module's ``__dict__``. They survive ``copy.deepcopy``
and pickling (``torch.save(model)``): the pickled form names the patched function, which is
rebuilt, checks included, when the model is loaded. What a patch changes outside the model (the
module-level functions every model shares, the pickling hook) is held while a patched model or the
class-level patch needs it and restored when the last one is unpatched (``shared_patches``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import inspect
import types
import warnings

import torch

from .families import FAMILIES, MODULE_TARGETS
from .forks import family_like, register_scoped
from .patch_registry import INHERITED as _INHERITED
from .patch_registry import family_of as _family_of
from .patch_registry import installed
from .patch_registry import model_types as _model_types
from .patch_registry import target_class as _target_class
from .plan.registry import REGISTRY
from .plan.spec import layout_of, multimodal_config
from .rewrite import helpers
from .rewrite.attention import check_backend
from .rewrite.before_trace import add_presence_check, install_output_recording, remove_presence_check
from .rewrite.edits import GENERIC_SPLIT
from .rewrite.generic import has_split, host_seqlens_towers, split_attention_targets
from .rewrite.nearest import nearest_fragment
from .rewrite.rewriter import RewriteError, rewrite
from .rewrite.roles import TOWER, role_of
from .rewrite.targets import Family, Target
from .rewrite.vision_in_step import ATTRIBUTE as VISION_EVERY_STEP
from .shared_patches import CLASS_LEVEL, HOLD_ATTR, Hold, critical, hold, release

# The (class, attribute) -> stock table, under the name Transformers' test-suite harness (hf-tests' plugin) reads
# to check a class-level patch stayed applied: the registry's own dict, never a copy.
_class_patches = REGISTRY.class_patches

__all__ = ["patch", "unpatch", "is_patched", "packing_refusal", "UnsupportedTransformers", "FamilyLeftStock", "check_family",
           "check_shared_functions", "refusal_for", "FAMILIES"]


class UnsupportedTransformers(RuntimeError):
    """The installed Transformers' code is not the code a syncfree patch was written for.

    ``family`` is the model type refused (``"transformers"`` for a function every model shares), ``where`` the
    stock function that does not match and ``problem`` what differs, with the installed code nearest to what the
    patch expects."""

    def __init__(self, message: str, family: str = "", where: str = "", problem: str = "") -> None:
        super().__init__(message)
        self.family, self.where, self.problem = family, where, problem


class FamilyLeftStock(UserWarning):
    """Class-level ``syncfree.patch()`` left a family stock: its installed code is not what the patch expects."""


_warned: set[tuple[str, str]] = set()  # (family, Transformers version) already warned of in this process


def _version() -> str:
    import transformers

    return transformers.__version__


def _refuse(family: str, where: str, problem: str) -> UnsupportedTransformers:
    return UnsupportedTransformers(
        f"syncfree cannot patch {family}: in the installed Transformers {_version()}, {where} is not the function "
        f"syncfree's patch was written for ({problem}). Nothing was patched. syncfree supports Transformers 5.17.0 "
        "through the releases it was tested with (`syncfree doctor` lists what matches); please report the version.",
        family, where, problem)


def stock_function(owner, attr: str, inherited: bool):
    """The stock function: also when the class is already patched; inherited ones through the MRO."""
    if (owner, attr) in REGISTRY.class_patches:
        saved = REGISTRY.class_patches[(owner, attr)]
        if saved is not _INHERITED:
            return saved
        return next((base.__dict__[attr] for base in owner.__mro__[1:] if attr in base.__dict__), None)
    if inherited:
        return getattr(owner, attr, None)
    return owner.__dict__.get(attr)


def _check_wrap(family: str, where: str, target: Target, fn) -> None:
    params = set(inspect.signature(fn).parameters)
    missing = [p for p in target.params if p not in params]
    if missing:
        raise _refuse(family, where, f"its parameters lack {missing}")
    if target.needs:
        # (Compared without whitespace: a call the stock code breaks over lines, as some towers' helpers do, is the
        # same code; any need found as written is found this way too.)
        source = "".join(inspect.getsource(inspect.unwrap(fn)).split())
        absent = [code for code in target.needs if "".join(code.split()) not in source]
        if absent:
            near = [nearest_fragment(fn, code) for code in absent]
            said = "; ".join(f"nearest to {code!r}: {n.describe()}" for code, n in zip(absent, near) if n is not None)
            raise _refuse(family, where, f"its code no longer contains {absent}" + (f"; {said}" if said else ""))


def _build(family: str, where: str, target: Target, stock, namespace=helpers):
    """``stock`` with ``target``'s edits made (compiled against ``namespace``: what the new code calls ``_syncfree``,
    the shared helpers or a family's ``Family.namespace``) and its wrapper put around it; built once."""
    # (Keyed on all three: the generic fix and full support rewrite one function apiece, and the same edits compiled
    # against another family's helpers are another function.)
    key = (stock, target, namespace)
    if key in REGISTRY.built:
        return REGISTRY.built[key]
    if stock is None:
        raise _refuse(family, where, "it does not exist")
    fn = stock
    if target.check_only:
        _check_wrap(family, where, target, stock)
        return stock
    if target.edits:
        try:
            fn = rewrite(fn, list(target.edits), namespace, where)
        except RewriteError as err:
            raise _refuse(family, where, str(err)) from None
    if target.wrap:
        _check_wrap(family, where, target, stock)
        fn = target.wrap(fn)
    REGISTRY.built[key] = fn
    REGISTRY.how[fn] = target
    return fn


def _is_tower(target: Target) -> bool:
    return target.wrap is not None and role_of(target.wrap) == TOWER


def _build_resolved(family: str, cls: type, target: Target, namespace=helpers) -> tuple[Target, object, object]:
    """(the target as matched, its stock function, its replacement): ``target.attr``'s, else the first of its
    ``alt_attrs`` that matches; where none does, ``target.attr``'s refusal. ``namespace`` as ``_build``'s."""
    first = None
    for attr in (target.attr, *target.alt_attrs):
        candidate = target if attr == target.attr else dataclasses.replace(target, attr=attr, alt_attrs=())
        stock = stock_function(cls, attr, candidate.inherited)
        try:
            return candidate, stock, _build(family, f"{cls.__name__}.{attr}", candidate, stock, namespace)
        except UnsupportedTransformers as err:
            first = first or err
    raise first


def _replacements(family: Family) -> list[tuple[type, Target, object, object]]:
    """Check every target first, then build every replacement: all or nothing."""
    found = []
    for target in family.targets:
        cls = _target_class(family, target)
        if cls is None:
            raise UnsupportedTransformers(f"syncfree cannot patch {family.model_type}: Transformers {_version()} has "
                                          f"no {target.cls}. Nothing was patched.", family.model_type, target.cls,
                                          "the class does not exist")
        try:
            target, stock, built = _build_resolved(family.model_type, cls, target, family.namespace)
        except UnsupportedTransformers:
            if not target.optional:
                raise
            continue
        if not target.check_only:
            found.append((cls, target, stock, built))
    for _cls, target, _, replacement in found:
        REGISTRY.origin[replacement] = (family.modeling, target.cls, target.attr)  # (the family's module: _rebind finds it)
    return found


def _module_replacements(refused: list | None = None) -> dict[tuple[str, str], tuple]:
    """Build (without installing) the module-level replacements not installed yet: (module, function) ->
    (stock, replacement, the class holding it for a method, else None). Where a required one does not match:
    raises, having changed nothing; or, given a ``refused`` list, appends the refusal there and goes on."""
    built = {}
    for (module_name, name), target in MODULE_TARGETS.items():
        if (module_name, name) in REGISTRY.module_patches:
            continue
        owner = importlib.import_module(module_name)
        holder = None
        if "." in name:  # a method of a class every model shares ("DynamicSlidingWindowLayer.lazy_initialization")
            holder = owner = getattr(owner, name.partition(".")[0], None)
        stock = vars(owner).get(name.rpartition(".")[2]) if owner is not None else None
        try:
            built[(module_name, name)] = (stock, _build("transformers", f"{module_name}.{name}", target, stock), holder)
        except UnsupportedTransformers as err:
            if target.optional:
                continue
            if refused is None:
                raise
            refused.append(err)
    return built


def _generic_replacements(model: torch.nn.Module) -> dict:
    """Replacements for the vision attention split of a family syncfree does not fully support."""
    replacements = {}
    for cls, target in split_attention_targets(model):
        where = f"{cls.__name__}.forward"
        replacement = _build(cls.__module__.rsplit(".", 1)[-1], where, target, cls.__dict__["forward"])
        REGISTRY.origin[replacement] = (cls.__module__, cls.__name__, "forward")
        replacements[(cls, "forward")] = replacement
    return replacements


def _locked(fn):
    """Run under the patch state's lock (``patch`` and ``unpatch`` may be called from several threads)."""

    @functools.wraps(fn)
    def locked(*args, **kwargs):
        with critical():
            return fn(*args, **kwargs)

    return locked


@_locked
def patch(model: torch.nn.Module | None = None, *, families: tuple[str, ...] | None = None,
          vision_attention: str = "split", vision_every_step: bool = False, verbose: bool = False,
          strict: bool = False, like: str | None = None):
    """Make the multimodal forward free of host syncs, without changing what it computes.

    With a model (``*ForConditionalGeneration``, ``*Model``, ``*VisionModel``, also inside a PEFT
    wrapper), patch that instance and return it. A model of a family syncfree does not fully support
    gets the generic fix of its vision attention split, where the stock code has it. Without a model,
    patch the classes of the fully supported ``families`` (default: all of them that the installed
    Transformers has), so every model of them, built before or after, is patched. A family whose installed
    code no longer matches the patch (a newer Transformers release changed it) is then left stock with one
    ``FamilyLeftStock`` warning naming the function, and every other family is patched; ``strict=True``
    raises ``UnsupportedTransformers`` instead, having patched nothing. A model instance of such a family is
    always refused with ``UnsupportedTransformers``.
    ``vision_attention`` picks how the vision attention runs its segments (fully supported families):
    ``"split"`` (one call per segment, as stock), ``"grouped"``, ``"block_diagonal"``, ``"varlen"`` or
    ``"auto"`` (see ``syncfree.rewrite.attention``). ``vision_every_step=True`` (a model instance of a fully
    supported family) makes every training forward run the vision tower for images and for videos, on a
    one-unit dummy where the micro-batch has none, so FSDP2/DDP ranks stay in step with text-only or
    image-only micro-batches (``syncfree.rewrite.vision_in_step``; outputs unchanged). ``verbose=True`` prints
    what was patched and what was not. ``like="<model type>"`` patches a model whose modeling code is a copy of
    that fully supported family (``syncfree.families.FAMILIES`` lists them) under other module and class names (a
    ``trust_remote_code`` checkpoint, a fork): each target is found in the copy by its renamed class, else by its
    code, and the copy is refused where an edit's code differs, as any release would be (``syncfree.forks``).
    """
    _check_module(model, "patch", allow_none=True)
    check_backend(vision_attention)
    if vision_every_step and model is None:
        raise ValueError("syncfree.patch: vision_every_step=True applies to a model instance; pass the model")
    if model is None:
        if like is not None:
            raise ValueError("syncfree.patch: like= names the family a model instance copies; pass the model")
        _patch_classes(families, vision_attention, verbose, strict)
        return None
    # Everything that can refuse is checked before anything changes: a refused patch leaves the model, the
    # classes and Transformers' modules exactly as they were.
    family = _family_of(model) if like is None else family_like(model, like, _refusal)
    if family is not None and vision_every_step and getattr(model.config, "vision_config", None) is None:
        raise ValueError(f"syncfree.patch: vision_every_step=True does not support {family.model_type} (an audio "
                         "model: it has no vision tower)")
    if family is not None and vision_every_step and not family.layout.tower.holds_projector:
        raise ValueError(f"syncfree.patch: vision_every_step=True does not support {family.model_type} yet (its "
                         "projector sits outside the vision tower, which the one-unit tower pass would not reach)")
    if family is not None and vision_every_step and not any(_takes_vision_every_step(m) for m in model.modules()):
        # (a tower under another name than ``visual``, e.g. ``vision_tower``: the pass would never be made)
        raise ValueError(f"syncfree.patch: vision_every_step=True does not support {family.model_type} yet (its "
                         "vision tower is not the multimodal model's `visual`, where the one-unit tower pass runs)")
    registered = register_scoped(family) if like is not None and family is not FAMILIES.get(like) else None
    try:
        _patch_model(model, family, vision_attention, vision_every_step, verbose)
    except BaseException:
        if registered is not None:
            registered()
        raise
    if registered is not None:  # (the copy's family stays registered while this model is patched: see unpatch)
        model.__dict__[_RELEASE_ATTR] = registered
    return model


_RELEASE_ATTR = "_syncfree_release_family"


def _patch_model(model, family, vision_attention: str, vision_every_step: bool, verbose: bool) -> None:
    if family is not None:
        found = _replacements(family)
        replacements = {(cls, t.attr): r for cls, t, _, r in found}
        towers = tuple(cls for cls, t, _, _ in found if _is_tower(t))
        module_functions = _module_replacements()
    else:
        if vision_every_step:
            raise ValueError(f"syncfree.patch: vision_every_step=True needs a fully supported family; "
                             f"{type(model).__name__} gets the generic split fix only")
        if vision_attention != "split":
            raise ValueError(f"syncfree.patch: vision_attention={vision_attention!r} needs a fully supported "
                             f"family; {type(model).__name__} gets the generic split fix only")
        replacements, towers, module_functions = _generic_replacements(model), (), {}
        on_host = host_seqlens_towers(model)
        if replacements and on_host:
            warnings.warn(f"syncfree.patch: {type(model).__name__} patched nothing: {', '.join(on_host)} makes its "
                          "attention's cu_seqlens from a host copy of the grid, so its vision attention split reads "
                          "no device value and the generic fix would remove no sync", stacklevel=3)
            return
        if not replacements:
            raise ValueError(f"syncfree.patch: no supported model in {type(model).__name__} (model types found: "
                             f"{_model_types(model) or 'none'}; supported: {', '.join(FAMILIES)}), and no vision "
                             "attention with the packed split syncfree can fix generically")
    bound = [(module, cls, attr, replacement) for module in model.modules()
             for (cls, attr), replacement in replacements.items() if isinstance(module, cls)]
    if not bound:
        raise ValueError(f"syncfree.patch: {type(model).__name__} holds no module that syncfree patches")
    marker = Hold(_reduce_patched)
    hold(marker, module_functions, _reduce_patched)
    patched = {}
    for module, cls, attr, replacement in bound:
        module.__dict__[attr] = _bound(replacement, module)
        module.__dict__[HOLD_ATTR] = marker
        patched[f"{cls.__name__}.{attr}"] = patched.get(f"{cls.__name__}.{attr}", 0) + 1
    for module in model.modules():
        if towers and isinstance(module, towers):
            module.__dict__["_syncfree_attention"] = vision_attention
            if family.layout.tower.records_hidden_states:
                install_output_recording(module)
        if vision_every_step and _takes_vision_every_step(module):
            module.__dict__[VISION_EVERY_STEP] = True
    if family is not None:
        add_presence_check(model)  # (before torch.compile traces: a stale prepared batch refused in one line)
    if verbose:
        from .patch_report import describe_patch  # (it reads this module's tables)

        print("\n".join(describe_patch(model).lines()))


def _refusal(model_type: str, cls: type, target: Target, namespace=helpers) -> UnsupportedTransformers | None:
    """Why ``target``'s edits and checks refuse ``cls``'s function, or None (for ``like=``: where a target lives).
    ``namespace``: the copied family's (``Family.namespace``), so that what is built here is what its patch uses."""
    try:
        _build_resolved(model_type, cls, target, namespace)
    except UnsupportedTransformers as err:
        return err
    return None


def _patch_classes(families: tuple[str, ...] | None, vision_attention: str, verbose: bool, strict: bool) -> None:
    """The class-level patch: every family whose installed code matches; each other one is left stock, with one
    warning (or, ``strict``, the refusal raised before anything changes). A family is never half-patched: all of
    its replacements are built and checked before any is installed."""
    if families is None:
        families = tuple(n for n, f in FAMILIES.items() if installed(f.modeling))
    unknown = [n for n in families if n not in FAMILIES]
    if unknown:
        raise ValueError(f"syncfree.patch: {unknown} are not fully supported families (supported: "
                         f"{', '.join(FAMILIES)}); patch a model instance to get the generic fix")
    planned, refused = [], []
    for name in families:
        try:
            planned += _replacements(FAMILIES[name])
        except UnsupportedTransformers as err:
            refused.append(err)
    module_functions = _module_replacements(refused)
    if strict and refused:
        raise refused[0]
    hold(CLASS_LEVEL, module_functions, _reduce_patched)  # (everything checked: from here on nothing raises)
    for cls, target, _stock, replacement in planned:
        if (cls, target.attr) not in REGISTRY.class_patches:
            REGISTRY.class_patches[(cls, target.attr)] = cls.__dict__.get(target.attr, _INHERITED)
        setattr(cls, target.attr, replacement)
        if _is_tower(target):
            _set_backend(cls, vision_attention)
    for err in refused:
        _warn_left_stock(err)
    if verbose:
        left = {err.family for err in refused}
        print(f"syncfree: patched the classes of {', '.join(n for n in families if n not in left)} ({len(planned)} "
              f"functions){'; left stock: ' + ', '.join(sorted(left)) if left else ''}; "
              "syncfree.patch_report.describe_patch(model) lists them for a model")


def _warn_left_stock(err: UnsupportedTransformers) -> None:
    """One line, once per family and Transformers release in a process."""
    key = (err.family, _version())
    if key in _warned:
        return
    _warned.add(key)
    what = "its shared function" if err.family == "transformers" else err.family
    warnings.warn(f"syncfree.patch: left {what} stock: in Transformers {_version()}, {err.where} no longer matches "
                  f"the code syncfree's patch was written for ({err.problem}); every other family is patched "
                  "(`syncfree doctor` lists them; patch(strict=True) raises instead)", FamilyLeftStock, stacklevel=4)


def check_family(family: str | Family) -> UnsupportedTransformers | None:
    """Why the installed Transformers' code does not match syncfree's patch of ``family`` (a fully supported
    model type), or None where every target matches. Builds the replacements (kept for a later patch); installs
    nothing."""
    try:
        _replacements(FAMILIES[family] if isinstance(family, str) else family)
    except UnsupportedTransformers as err:
        return err
    return None


def refusal_for(model: torch.nn.Module) -> UnsupportedTransformers | None:
    """Why ``patch(model)`` would refuse the installed Transformers' code for this model's family, or None (a
    family that matches, or a model that gets the generic fix). The tools ask this first, so that a family a
    release changed is a row that says why, not an error."""
    family = _family_of(model)
    return None if family is None else check_family(family)


def check_shared_functions() -> list[UnsupportedTransformers]:
    """The refusals of the module-level functions every model shares (``transformers.masking_utils``' SDPA mask
    shortcut, ...) that syncfree replaces; empty where they all match."""
    refused: list[UnsupportedTransformers] = []
    _module_replacements(refused)
    return refused


def _takes_vision_every_step(module) -> bool:
    """Whether ``module`` is a multimodal model whose forward ``vision_in_step`` extends (its tower is ``visual``)."""
    return hasattr(module, "visual") and hasattr(module, "language_model")


def _check_module(model, verb: str, allow_none: bool = False) -> None:
    if model is None and allow_none:
        return
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"syncfree.{verb} takes a model (a torch.nn.Module: a Transformers model, its vision tower, "
                        f"or a PEFT wrapper){' or nothing' if allow_none else ''}, got {type(model).__name__}")


def _set_backend(cls: type, backend: str) -> None:
    if backend == "split":
        if "_syncfree_attention" in cls.__dict__:
            delattr(cls, "_syncfree_attention")
    else:
        cls._syncfree_attention = backend


@_locked
def unpatch(model: torch.nn.Module | None = None) -> None:
    """Undo ``patch``: restore the stock functions exactly (on the instance, or on the classes). The functions
    every model shares are restored too, once no other patched model (or the class-level patch) needs them."""
    _check_module(model, "unpatch", allow_none=True)
    if model is None:
        for cls, _attr in list(REGISTRY.class_patches):
            if "_syncfree_attention" in cls.__dict__:
                delattr(cls, "_syncfree_attention")
        for (cls, attr), stock in list(REGISTRY.class_patches.items()):
            if stock is _INHERITED:
                delattr(cls, attr)
            else:
                setattr(cls, attr, stock)
            del REGISTRY.class_patches[(cls, attr)]
        release(CLASS_LEVEL)
        return
    remove_presence_check(model)
    registered = model.__dict__.pop(_RELEASE_ATTR, None)
    if registered is not None:  # (a copy patched ``like=`` a family: its registration ends with its last model)
        registered()
    for module in model.modules():
        marker = module.__dict__.pop(HOLD_ATTR, None)
        if marker is not None:
            release(marker)
        release(module)  # (a part of a model that unpickling patched on its own)
        for attr in ("_syncfree_attention", "_syncfree_buckets", "_syncfree_bucket_backend", "_syncfree_compiled",
                     VISION_EVERY_STEP):
            module.__dict__.pop(attr, None)
        for attr, value in list(module.__dict__.items()):
            if getattr(value, "__func__", None) in REGISTRY.origin:
                del module.__dict__[attr]


def packing_refusal(model, collated: bool = True) -> str | None:
    """Why ``model`` cannot take a padding-free packed batch (``syncfree.packing_collator``'s; ``collated=False``: one
    packed elsewhere, its 4-row positions given), in one line naming its family; None where it can: a fully supported
    family whose patched forward keeps packed samples apart, patched."""
    config = multimodal_config(model)  # (a PEFT wrapper: the model's own config, as prepare finds it)
    model_type = getattr(config, "model_type", type(model).__name__)
    layout = layout_of(model_type)
    if layout is None:
        return (f"syncfree refuses packed batches for {model_type}: not a family syncfree supports, so nothing keeps "
                "the samples of a packed row apart")
    if layout.packing_refused:
        return f"syncfree refuses packed batches for {model_type}: {layout.packing_refused}"
    if collated and layout.audio.encoder:
        return (f"syncfree refuses packed batches for {model_type}: its audio inputs (input_features, "
                "feature_attention_mask) and audio-in-video positions are not laid out by the packing collator (a "
                "batch packed elsewhere, with its 4-row position_ids, is taken)")
    if isinstance(model, torch.nn.Module) and not is_patched(model):
        return (f"syncfree refuses packed batches for an unpatched {model_type} model: stock attends across the "
                "samples of a packed row; call syncfree.patch(model) first")
    if isinstance(model, torch.nn.Module) and ("transformers.masking_utils", "_preprocess_mask_arguments") \
            not in REGISTRY.module_patches:
        return (f"syncfree refuses packed batches for {model_type}: this Transformers release's mask code "
                "(masking_utils._preprocess_mask_arguments) is not the one syncfree hands the samples' boundaries to")
    return None


def is_patched(model: torch.nn.Module) -> bool:
    """True when ``model`` (or its classes) runs syncfree's functions."""
    _check_module(model, "is_patched")
    for m in model.modules():
        if (type(m), "forward") in REGISTRY.class_patches:
            return True
        if any(getattr(v, "__func__", None) in REGISTRY.origin for v in m.__dict__.values()):
            return True
    return False


_instance_forms: dict = {}  # a staticmethod replacement -> the function an instance binds (it drops the instance)


def _bound(replacement, obj) -> types.MethodType:
    """``replacement`` as ``obj``'s own attribute: a method bound to it. A ``staticmethod`` (stock's was one) takes no
    instance: its bound form drops it, and the registry knows that form as it knows the replacement (pickling,
    ``unpatch``, ``is_patched``)."""
    if isinstance(replacement, staticmethod):
        form = _instance_forms.get(replacement)
        if form is None:
            inner = replacement.__func__

            @functools.wraps(inner)
            def form(_instance, *args, **kwargs):
                return inner(*args, **kwargs)

            _instance_forms[replacement] = form
        REGISTRY.origin[form] = REGISTRY.origin[replacement]
        replacement = form
    return types.MethodType(replacement, obj)


# ---- pickling ---------------------------------------------------------------------------------------
def _reduce_patched(method):
    """How pickle stores a syncfree method: by name, rebuilt (checks included) on load; None for any other."""
    origin = REGISTRY.origin.get(method.__func__)
    return None if origin is None else (_rebind, (method.__self__, *origin))


def _rebind(obj, modeling: str, cls_name: str, attr: str):
    family = next((f for f in FAMILIES.values() if f.modeling == modeling), None)
    if family is not None:
        for _cls, target, _, replacement in _replacements(family):
            if target.cls == cls_name and target.attr == attr:
                hold(obj, _module_replacements(), _reduce_patched)
                return _bound(replacement, obj)
    else:  # the generic fix (the object is still being unpickled here: only its class is asked)
        cls = getattr(importlib.import_module(modeling), cls_name, None)
        if cls is not None and has_split(cls.__dict__.get("forward")):
            target = Target(cls_name, "forward", edits=GENERIC_SPLIT)
            hold(obj, {}, _reduce_patched)  # (no shared function; the pickling hook, for its next pickling)
            return types.MethodType(_build(cls_name, f"{cls_name}.forward", target, cls.__dict__["forward"]), obj)
    raise UnsupportedTransformers(f"syncfree cannot restore the patched {cls_name}.{attr} of a pickled model")
