"""Checks every fully supported family passes, shared by the per-family test files."""

from __future__ import annotations

import contextlib
import copy
import gc
import types

import torch

import syncfree
from syncfree.audit import assert_no_sync, audit, emulate_cuda
from syncfree.plan.rope import rope_index
from syncfree.plan.rope_host import rope_index_host
from syncfree.plan.spec import ModelSpec
from syncfree.presets import build_model

_pairs: dict = {}


def shipped_types() -> list[str]:
    """The registered families whose modeling code the installed Transformers ships (a family may be declared for a
    release that has it only), sorted."""
    import importlib.util

    from syncfree.families import FAMILIES

    def shipped(model_type: str) -> bool:
        try:
            return importlib.util.find_spec(FAMILIES[model_type].layout.modeling) is not None
        except ModuleNotFoundError:
            return False

    return sorted(t for t in FAMILIES if shipped(t))


def model_pair(name: str, attn: str = "sdpa", dtype=torch.float32):
    """A stock model and a patched one with the same weights, built once per test session."""
    key = (name, attn, dtype)
    if key not in _pairs:
        _pairs[key] = (build_model(name, attn=attn, dtype=dtype),
                       syncfree.patch(build_model(name, attn=attn, dtype=dtype)))
    return _pairs[key]


def check_prepared_prefill_has_no_sync_and_moved_inputs_one(stock, patched, batch) -> None:
    """0 syncs with prepare(), 1 with inputs moved by hand, and the logits of stock (emulated device)."""
    with torch.no_grad():
        expected = stock(**batch).logits
        with emulate_cuda():
            patched.to("cuda")
            try:
                kwargs = syncfree.prepare(batch, "cuda", patched)
                with assert_no_sync():
                    logits = patched(**kwargs).logits
                moved = {k: v.to("cuda") for k, v in batch.items()}
                with assert_no_sync(max_syncs=1):
                    patched(**moved)
                assert torch.equal(logits.cpu(), expected)
            finally:
                patched.to("cpu")


def check_forward_equals_stock(stock, patched, batch) -> None:
    """Stock's logits (not NaN) from the patched model, without and with prepare(), and stock's cached rope deltas."""
    with torch.no_grad():
        expected = stock(**batch).logits
        deltas = getattr(stock.model, "rope_deltas", None)
        assert not expected.isnan().any()
        assert torch.equal(patched(**batch).logits, expected)
        assert torch.equal(patched(**syncfree.prepare(batch, None, patched)).logits, expected)
        if deltas is not None:
            assert torch.equal(patched.model.rope_deltas, deltas)


def check_prepared_prefill_is_sync_and_copy_free(stock, patched, batch, **forward) -> None:
    """0 syncs and 0 blocking copies with prepare(), 1 sync with inputs moved by hand, and the logits of stock
    (emulated device; ``forward``: extra keyword arguments of the prepared forward)."""
    with torch.no_grad():
        expected = stock(**batch).logits
        with emulate_cuda():
            patched.to("cuda")
            try:
                with audit() as prepared:
                    logits = patched(**syncfree.prepare(batch, "cuda", patched), **forward).logits
                logits = logits.cpu()  # (after the audit: reading the result is not the forward's doing)
                with audit() as moved:
                    patched(**{k: v.to("cuda") for k, v in batch.items()})
            finally:
                patched.to("cpu")
                if hasattr(getattr(patched, "model", None), "rope_deltas"):
                    patched.model.rope_deltas = None  # (cached by the forward: an emulated tensor otherwise)
    assert torch.equal(logits, expected)
    assert (len(prepared.syncs), len(prepared.blocking_copies)) == (0, 0)
    assert len(moved.syncs) == 1


def check_rope_index_matches_stock(stock, batch: dict) -> None:
    """syncfree's rotary index (the device one and the plan's NumPy one) against the family's own stock function."""
    args = tuple(batch.get(k) for k in ("input_ids", "mm_token_type_ids", "image_grid_thw", "video_grid_thw",
                                        "attention_mask"))
    want = stock.model.get_rope_index(*args)
    options = ModelSpec.from_config(stock.config).rope_options()
    for got in (rope_index(*args, **options), rope_index_host(*args, **options)):
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w)


def check_generate_and_backward_equal_stock(stock, patched, batch, options: dict, prepared: dict) -> None:
    """The same generated ids (with and without prepare), the same loss and every gradient bit for bit."""
    with torch.no_grad():
        expected = stock.generate(**batch, **options)
        assert torch.equal(patched.generate(**prepared, **options), expected)
        assert torch.equal(patched.generate(**batch, **options), expected)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    losses = []
    for model, inputs in ((stock, batch), (patched, prepared)):
        model.train()
        model.zero_grad()
        loss = model(**inputs, labels=labels).loss
        loss.backward()
        losses.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
        model.eval()
    assert torch.equal(losses[0][0], losses[1][0])
    assert losses[0][1].keys() == losses[1][1].keys()
    assert all(torch.equal(losses[0][1][n], losses[1][1][n]) for n in losses[0][1])


def prepared_generate_audited(stock, patched, batch: dict, options: dict):
    """``generate()`` from a prepared batch on the emulated device, audited: (patched ids, stock's ids, the audit
    report). The patched model goes back to the CPU afterwards, whatever happens."""
    with torch.no_grad():
        expected = stock.generate(**batch, **options)
        with emulate_cuda():
            patched.to("cuda")
            try:
                with audit() as report:
                    ids = patched.generate(**syncfree.prepare(batch, "cuda", patched), **options)
                ids = ids.cpu()
            finally:
                patched.to("cpu")
    return ids, expected, report


def check_generate_modes_equal_stock(stock, patched, batch, options: dict) -> None:
    """The same ids as stock from a prepared batch with the static cache, and with beams returning several sequences."""
    with torch.no_grad():
        for extra in (dict(cache_implementation="static"), dict(num_beams=2, num_return_sequences=2)):
            assert torch.equal(patched.generate(**syncfree.prepare(batch, None, patched), **options, **extra),
                               stock.generate(**batch, **options, **extra))


def check_attention_backend_equals_stock(tower, grid: torch.Tensor, pixels: torch.Tensor, backend: str,
                                         output: str = "pooler_output") -> None:
    """The stock ``tower``'s ``output`` from a patched copy of it that attends by ``backend`` (bit for bit; within
    float32 rounding for ``block_diagonal``, whose one masked call reduces in another order than a call per segment)."""
    import copy

    with torch.no_grad():
        expected = getattr(tower(pixels, grid_thw=grid), output)
        got = getattr(syncfree.patch(copy.deepcopy(tower), vision_attention=backend)(pixels, grid_thw=grid), output)
    if backend == "block_diagonal":
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    else:
        assert torch.equal(got, expected)


def check_placeholder_mismatch_raises_stocks_error(stock, patched, batch: dict) -> None:
    """A batch whose single image (6 placeholders) has its last placeholder replaced by a text id: the patched model
    raises stock's ValueError, word for word."""
    image = stock.config.image_token_id
    ids = batch["input_ids"].clone()
    assert int((ids == image).sum()) == 6
    ids[ids == image] = torch.tensor([image] * 5 + [5])
    batch = {**batch, "input_ids": ids}
    errors = []
    for model in (stock, patched):
        with torch.no_grad():
            try:
                model(**batch)
            except ValueError as raised:
                errors.append(str(raised))
    assert len(errors) == 2 and errors[0] == errors[1] and "tokens: 5, features: 6" in errors[0]


def check_vision_every_step(preset: str, batch: dict) -> None:
    """``patch(vision_every_step=True)`` in training: both tower passes (an image and a video one, real or one-unit
    dummies) in a forward, stock's loss and gradients (zeros where only the dummy reached a vision parameter), and
    no sync with inputs from ``prepare`` (emulated device). ``batch`` holds ``labels``."""
    from syncfree.presets import build_model

    stock = build_model(preset, dtype=torch.float32, seed=0).train()
    stock_loss = stock(**batch).loss
    stock_loss.backward()
    model = build_model(preset, dtype=torch.float32, seed=0).train()
    syncfree.patch(model, vision_every_step=True)
    calls = []
    model.model.visual.register_forward_hook(lambda *args: calls.append(1))
    loss = model(**syncfree.prepare(batch, "cpu", model)).loss
    loss.backward()
    assert len(calls) == 2
    assert torch.equal(loss, stock_loss)
    grads = dict(stock.named_parameters())
    for name, p in model.named_parameters():
        reference = grads[name].grad
        if reference is None:  # a vision parameter the stock step did not reach: the dummy gives it zeros
            assert p.grad is not None and not p.grad.any(), name
        else:
            assert torch.equal(p.grad, reference), name
    with emulate_cuda():
        model.to("cuda")
        prepared = syncfree.prepare(batch, "cuda", model)
        with assert_no_sync():
            model(**prepared).loss.backward()


def traced_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` for Dynamo to trace. Dynamo keeps references to the parameters it traced (past
    ``torch._dynamo.reset()``), after which moving the session-wide model pairs (``model_pair``) to the emulated device,
    which swaps their parameters, fails in a later test on the same worker."""
    return copy.deepcopy(module)


def checkpointing(model, kwargs: dict | None) -> None:
    """Turn activation checkpointing on with ``kwargs`` (off with None), by the name the installed release has (the
    old name warns from 5.25)."""
    new_name = hasattr(model, "activation_checkpointing_enable")
    if kwargs is None:
        (model.activation_checkpointing_disable if new_name else model.gradient_checkpointing_disable)()
    elif new_name:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)

def check_checkpointed_training_equals_stock(stock, patched, batch: dict, reentrant: bool) -> None:
    """A training step with gradient checkpointing (reentrant or not): the recompute runs in the backward, after the
    forward's plan is gone, and must take the path the forward took: stock's loss and every gradient bit for bit, or,
    where stock's own step fails (reentrant checkpointing in some families), stock's exception word for word."""
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    results = []
    for model, inputs in ((stock, batch), (patched, syncfree.prepare(batch, None, patched))):
        checkpointing(model, {"use_reentrant": reentrant})
        model.train()
        model.zero_grad()
        try:
            loss = model(**inputs, labels=labels).loss
            loss.backward()
            results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                            if p.grad is not None}))
        except Exception as err:  # (whatever stock raises, the patched model must raise it too)
            results.append(err)
        finally:
            checkpointing(model, None)
            model.eval()
            model.zero_grad(set_to_none=True)
    if isinstance(results[0], Exception) or isinstance(results[1], Exception):
        assert type(results[1]) is type(results[0]) and str(results[1]) == str(results[0]), results
        return
    (want_loss, want), (got_loss, got) = results
    assert torch.equal(got_loss, want_loss) and got.keys() == want.keys()
    assert [n for n in want if not torch.equal(got[n], want[n])] == []

def tower_graph_breaks(patched, tower, batch: dict):
    """``torch._dynamo.explain`` of the patched ``tower`` on the batch's images, handed the plan's vision plan."""
    plan = syncfree.prepare(batch, None, patched)["syncfree_plan"].image
    tower = traced_copy(tower)
    explained = torch._dynamo.explain(tower)(batch["pixel_values"], grid_thw=plan.grid_thw, syncfree_vision_plan=plan)
    counted = types.SimpleNamespace(graph_break_count=explained.graph_break_count,
                                    break_reasons=[types.SimpleNamespace(reason=str(r.reason), user_stack=list(r.user_stack))
                                                   for r in explained.break_reasons])
    del explained
    torch._dynamo.reset()
    gc.collect()
    return counted


def standard_layouts(unit: int) -> dict:
    """The processor layouts every family is checked on, in pixels that are multiples of ``unit`` (patch x merge):
    one image; images of different sizes; a video; videos and an image; padding and a text-only row."""
    from syncfree.inputs import Image, Text, Video

    u = unit
    return {
        "one image": [[Text(4), Image(3 * u, 4 * u), Text(3)]],
        "images of different sizes": [[Text(2), Image(u, 2 * u), Text(1), Image(4 * u, u), Text(1), Image(u, u),
                                       Text(2)]],
        "video": [[Text(3), Video(6, 2 * u, 3 * u), Text(2)]],
        "image and videos": [[Text(1), Video(4, 2 * u, 2 * u), Text(2), Image(2 * u, u), Text(1), Video(2, u, 2 * u),
                              Text(1)]],
        "padding and a text-only row": [[Text(2), Image(2 * u, 3 * u), Text(5)], [Text(1), Video(2, u, u), Text(1)],
                                        [Text(3)]],
    }


@contextlib.contextmanager
def registration_lifted(model_type: str):
    """The family ``model_type`` as if syncfree did not support it (its entry out of the family table for the block):
    its models get the generic split fix. Every family with the packed split whose tiny model builds is fully
    supported now (MiniCPM-V 4.7 last), so the generic fix's tests run on one of them this way."""
    from syncfree.families import FAMILIES
    from syncfree.plan.registry import REGISTRY

    # patch() caches what it built per stock function: the generic fix and the full support rewrite the same vision
    # attention differently, so neither may find the other's (a process never sees both but here).
    table, built = dict(FAMILIES), dict(REGISTRY.built)
    FAMILIES.pop(model_type, None)
    REGISTRY.built.clear()
    try:
        yield
    finally:
        FAMILIES.clear()
        FAMILIES.update(table)  # (in its order: the family table's order is the groups')
        REGISTRY.built.clear()
        REGISTRY.built.update(built)


# ---- every family's tiny model and two-row batch ---------------------------------------------------------------
def _tiny_presets() -> dict:
    from syncfree.families import PRESETS

    tiny = {}
    for name, preset in PRESETS.items():
        if name.endswith("-tiny"):
            tiny.setdefault(preset.values["model_type"], name)
    return tiny


TINY = _tiny_presets()  # model type -> its first tiny preset

# The families whose tiny model builds and runs slowest on a CPU (reference kernels for their linear-attention layers):
# their runs are marked slow.
SLOW_TINY = {"glm5_next", "qwen4_exp", "dots3_note"}


def installed(model_type: str) -> bool:
    """Whether this Transformers release has the family's modeling module (a family is registered either way)."""
    import importlib.util

    from syncfree.families import FAMILIES

    family = FAMILIES.get(model_type)
    return family is not None and importlib.util.find_spec(family.modeling.rsplit(".", 1)[0]) is not None


def tiny_family_params() -> list:
    """One pytest parameter per fully supported family, skipped where this Transformers release lacks it."""
    import importlib.util

    import pytest

    from syncfree.families import FAMILIES

    params = []
    for model_type, family in FAMILIES.items():
        marks = [pytest.mark.skipif(
            importlib.util.find_spec(family.modeling.rsplit(".", 1)[0]) is None or model_type not in TINY,
            reason=f"this Transformers release has no {model_type} (or no tiny preset)")]
        params.append(pytest.param(model_type, id=model_type,
                                   marks=marks + ([pytest.mark.slow] * (model_type in SLOW_TINY))))
    return params


def unit_of(config) -> int:
    """Image sides are multiples of patch x merge (the merge is named differently across families)."""
    from syncfree.census.inputs import image_unit

    return image_unit(config)


def two_rows(config, preset: str) -> dict:
    """The family's processor-style batch: two rows, the second shorter (so left-padded)."""
    from syncfree.families import PRESETS
    from syncfree.inputs import Image, Text, asr_layout, is_audio_only, processor_batch

    if is_audio_only(config):
        samples = asr_layout("mixed")[:2]
    else:
        u = unit_of(config)
        samples = [[Text(4), Image(2 * u, 2 * u), Text(3)], [Text(2), Image(u, u), Text(1)]]
    batch = processor_batch(config, samples, pad_token_id=PRESETS[preset].pad_token_id)
    assert batch["attention_mask"][1, 0] == 0 and batch["attention_mask"][0].all(), "the second row is left-padded"
    return batch


def first_row_edit_cases(rows) -> dict:
    """Hypothesis strategies for a host-index test over ``rows`` (sample layouts), either padding side, a seed, with
    and without a mask, and a few ``edited_first_row`` edits: ``@given(**first_row_edit_cases(rows))``."""
    from hypothesis import strategies as st

    edits = st.lists(st.tuples(st.sampled_from(["drop", "insert", "retype"]), st.integers(0, 10**6), st.integers(0, 2)),
                     max_size=3)
    return dict(rows=rows, left=st.booleans(), seed=st.integers(0, 2**16), masked=st.booleans(), edits=edits)


def edited_first_row(batch: dict, edits) -> dict:
    """``batch`` with its first row's kept tokens edited, ids and token types together (the other rows, and the
    padding side, as they were; the mask keeps the edited row's tokens): ``edits`` as ``(op, at, type)`` with op
    "drop" (the token at ``at``, modulo the row), "insert" (a text token, or a placeholder of ``type``, before it) or
    "retype" (its type set to ``type``). For checking a host index on layouts no processor writes."""
    ids, types, mask = (batch[n][0].tolist() for n in ("input_ids", "mm_token_type_ids", "attention_mask"))
    row = [(i, t) for i, t, m in zip(ids, types, mask) if m]
    for op, at, kind in edits:
        at = at % (len(row) + 1)
        if op == "drop" and at < len(row) and len(row) > 1:
            del row[at]
        elif op == "insert":
            row.insert(at, (row[min(at, len(row) - 1)][0], kind))
        elif op == "retype" and at < len(row):
            row[at] = (row[at][0], kind)
    left = mask[0] == 0
    width = max(len(row), batch["input_ids"].shape[1])
    out = dict(batch)
    for name, first in (("input_ids", [i for i, _ in row]), ("mm_token_type_ids", [t for _, t in row]),
                        ("attention_mask", [1] * len(row))):
        rows = [first] + [batch[name][r].tolist() for r in range(1, batch[name].shape[0])]
        rows = [([0] * (width - len(r)) + r) if left else (r + [0] * (width - len(r))) for r in rows]
        out[name] = torch.tensor(rows, dtype=batch[name].dtype)
    return out


def check_host_index_is_stocks(index, config, batch: dict, names: tuple, masked: bool, edited: bool) -> None:
    """A family's NumPy index (``index(spec, host, mask)``) against stock's own ``get_rope_index`` run on the same host
    tensors (the batch's ``names``): where it answers, every position and delta is stock's (dtype, shape, values); an
    unedited batch (the processor's own layout) it must answer; where it does not, the plan runs stock's index."""
    from syncfree.plan.rope_stock import stock_rope_index
    from syncfree.plan.spec import ModelSpec

    spec = ModelSpec.from_config(config)
    host = {n: batch.get(n) for n in names}
    mask = batch["attention_mask"] if masked or not bool(batch["attention_mask"].all()) else None
    got = index(spec, host, mask)
    types = host.get("mm_token_type_ids")
    if isinstance(types, torch.Tensor) and types.dim() == 2 and not types.dtype.is_floating_point:
        # (the plan hands the index the placeholder runs it found: the same answer as the index's own runs)
        from syncfree.plan.token_types import placeholder_runs

        again = index(spec, host, mask, runs=placeholder_runs(types.numpy().astype("int64")))
        assert (again is None) == (got is None)
        assert got is None or all(torch.equal(a, g) for a, g in zip(again, got))
    if not edited:
        assert got is not None  # (the processor's layouts: never left to stock's walk)
    if got is None:
        return
    want = stock_rope_index(spec.vision_module, spec.rope.host_class, config, attention_mask=mask, **host)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)
