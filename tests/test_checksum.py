"""The keyed device checksum of a plan's control tensors: the host's NumPy sum is the device's, the device makes the
host's weights from the plan's seed and key, each plan draws its own key, an edit that keeps a linear checksum
``sum(v_i * (i + 1))`` changes the keyed one, and so do values moved by 2**63 (no bound left modulo 2**64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import syncfree
from syncfree.audit import emulate_cuda
from syncfree.inputs import batch_to, build_inputs, named_layout
from syncfree.plan.batch import PLAN_KEY, plan_inputs
from syncfree.plan.checksum import _GAMMA, _checksum, _host_checksum, assert_given_match, device_weights, host_weights
from syncfree.presets import build_model


def _draw_weights(n: int) -> np.ndarray:
    return host_weights(n)[2]


def _linear(t: torch.Tensor) -> int:
    """The unkeyed checksum ``sum(v_i * (i + 1))``, wrapping as int64 does."""
    flat = t.reshape(-1).to(torch.int64)
    return int((flat * torch.arange(1, flat.numel() + 1)).sum())


def _linear_collision(t: torch.Tensor, a: int, b: int, c: int, d: int, delta: int) -> torch.Tensor:
    """``t`` with ``delta`` added at flat positions a and d and taken away at b and c (a + d == b + c): the linear
    checksum cannot tell the two apart."""
    edited = t.clone().reshape(-1)
    edited[[a, d]] += delta
    edited[[b, c]] -= delta
    return edited.reshape(t.shape)


def test_every_control_tensor_is_checked():
    """One checksum per control input the plan keeps, every registered family's declared inputs among them."""
    model = build_model("qwen3-vl-tiny")
    plan = syncfree.prepare(build_inputs(model.config, named_layout("mixed", side=64)), None, model)[PLAN_KEY]
    assert tuple(plan.host) == plan_inputs()
    assert plan.checksums.numel() == len(plan_inputs()) + 3  # (then the weights' step, seed and key: nothing token-sized)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=300),
       dtype=st.sampled_from([torch.int64, torch.int32, torch.bool, torch.float32, torch.float64, torch.bfloat16]))
def test_the_host_checksum_is_the_one_the_device_computes(values, dtype):
    """The plan's checksums are made in NumPy on the host and compared with PyTorch's on the device: both wrap
    modulo 2**64 (products and sums), so any value, overflowing or not, gives the same number; floats by their bits."""
    t = torch.tensor(values, dtype=torch.int64)
    if dtype is torch.bool:
        t = t.to(dtype)
    elif dtype is torch.int32:
        t = (t % 2**31).to(dtype)
    elif dtype.is_floating_point:
        t = (t % 2**20).to(dtype) / 7
    weights = _draw_weights(2 * len(values))
    assert _host_checksum(t, weights) == int(_checksum(t, torch.from_numpy(weights)))


def test_each_plan_draws_its_own_odd_weights():
    model = build_model("qwen3-vl-tiny")
    batch = build_inputs(model.config, named_layout("mixed", side=64), padding_side="left")
    first, second = (syncfree.prepare(batch, None, model)[PLAN_KEY].checksums for _ in range(2))
    n = 2 * batch["input_ids"].numel()  # two halves per value of the largest control tensor
    weights = device_weights(first, n), device_weights(second, n)
    assert all(bool((w % 2 != 0).all()) for w in weights)
    assert not torch.equal(*weights)
    k = len(plan_inputs())
    assert not torch.equal(first[:k], second[:k])


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 5000))
def test_the_device_makes_the_hosts_weights_from_the_seed_and_key(n):
    """Nothing token-sized is uploaded for the weights: the device hashes the same places with the plan's seed and
    key, bit for bit the host's NumPy weights."""
    from syncfree.plan import checksum

    seed, key, weights = host_weights(n)
    table = torch.tensor([0, _GAMMA, seed, key], dtype=torch.int64)
    assert np.array_equal(device_weights(table, n).numpy(), weights)
    assert checksum._SEED == -2 and checksum._KEY == -1


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.integers(0, 1), min_size=2, max_size=64), data=st.data())
def test_values_moved_by_2_to_the_63_change_the_keyed_checksum(values, data):
    """2**63 added to two entries changes a sum of whole values weighted by odd numbers by 2**64 * odd: nothing modulo
    2**64. Summed by 32-bit halves, each high half moves by 2**31 and the keyed sum changes (it could only stay with
    probability 2**-32)."""
    t = torch.tensor(values, dtype=torch.int64)
    i, j = data.draw(st.lists(st.integers(0, len(values) - 1), min_size=2, max_size=2, unique=True))
    edited = t.clone()
    edited[[i, j]] += -2**63  # (2**63 modulo 2**64)
    odd = torch.tensor([3, 5], dtype=torch.int64)
    assert int((edited[[i, j]] * odd).sum()) == int((t[[i, j]] * odd).sum())  # the bound of whole values
    weights = _draw_weights(2 * len(values))
    assert _host_checksum(edited, weights) != _host_checksum(t, weights)


def test_a_mask_moved_by_2_to_the_63_after_the_move_is_refused_on_the_device():
    """The edit the bound allowed: a prepared batch's mask, two masked entries moved by 2**63 through ``.data`` (stock's
    ``.bool()`` then attends there, the plan masks them). Refused by name on the device."""
    model = syncfree.patch(build_model("qwen2.5-vl-tiny"))
    from syncfree.inputs import Image, Text

    batch = build_inputs(model.config, [[Text(12), Image(56, 56), Text(20)], [Text(4), Image(56, 56), Text(3)]],
                         padding_side="left")
    assert not batch["attention_mask"][1, :2].any()
    with emulate_cuda():
        model.to("cuda")
        try:
            prepared = syncfree.prepare(batch, "cuda", model)
            prepared["attention_mask"].data[1, :2] += -2**63
            with torch.no_grad(), pytest.raises(RuntimeError, match="attention_mask differs"):
                model(**prepared)
        finally:
            model.to("cpu")
            model.model.rope_deltas = None


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(0, 2000), min_size=8, max_size=200), data=st.data())
def test_a_linear_collision_changes_the_keyed_checksum(values, data):
    """Values moved in pairs at positions with a + d == b + c keep ``sum(v_i * (i + 1))``; with random odd weights
    the keyed sum changes (it could only stay with probability 2**-63 here: the differences are odd)."""
    t = torch.tensor(values)
    n = t.numel()
    a = data.draw(st.integers(0, n - 4))
    gap = data.draw(st.integers(1, (n - 1 - a) // 3))
    b, c, d = a + gap, a + 2 * gap, a + 3 * gap
    delta = data.draw(st.sampled_from([1, -1, 3, 7]))
    edited = _linear_collision(t, a, b, c, d, delta)
    assert _linear(edited) == _linear(t) and not torch.equal(edited, t)
    weights = _draw_weights(2 * n)
    assert _host_checksum(edited, weights) != _host_checksum(t, weights)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.sampled_from([0.5, 1.0, 2.0, 1 / 3, 4.0]), min_size=2, max_size=16), data=st.data())
def test_float_edits_in_the_high_bits_change_the_keyed_checksum(values, data):
    """Two sign flips, or an exponent moved up here and down there, are multiples of high powers of two in a float's
    64 bits; the float64 value is summed as two 32-bit halves, so they are caught too."""
    t = torch.tensor(values, dtype=torch.float32)
    i, j = data.draw(st.lists(st.integers(0, len(values) - 1), min_size=2, max_size=2, unique=True))
    signs, scaled = t.clone(), t.clone()
    signs[[i, j]] = -signs[[i, j]]
    scaled[i], scaled[j] = scaled[i] * 2, scaled[j] / 2
    weights = _draw_weights(2 * len(values))
    for edited in (signs, scaled):
        assert _host_checksum(edited, weights) != _host_checksum(t, weights)


def test_a_device_tensor_that_became_float_is_refused_on_the_host():
    model = build_model("qwen3-vl-tiny")
    carried = syncfree.prepare(build_inputs(model.config, named_layout("image", side=64)), None, model)
    with emulate_cuda():
        plan = carried[PLAN_KEY].to("cuda")
        moved = batch_to(carried, "cuda")
        assert_given_match(plan, moved)  # unchanged: accepted
        moved["attention_mask"] = moved["attention_mask"].float()
        with pytest.raises(ValueError, match="attention_mask became torch.float32"):
            assert_given_match(plan, moved)


def test_the_table_is_the_sums_then_step_seed_and_key():
    from syncfree.plan.checksum import host_checksums

    host = {"input_ids": torch.zeros(2, 5, dtype=torch.long), "second_per_grid_ts": torch.ones(7)}
    table = host_checksums(host)
    assert table.numel() == len(host) + 3
    weights = device_weights(table, 14)  # (7 floats: 14 halves, the longest)
    assert int(table[1]) == _host_checksum(host["second_per_grid_ts"], weights.numpy())


def test_the_weights_and_checksum_inductor_compiles_are_the_eager_ones():
    # (Inductor folded the weights' first step, a fresh arange times SplitMix64's step, at compile time and corrupted
    # memory: a whole-graph compile then refused every prepared batch as stale, or crashed)
    from syncfree.plan.checksum import _checksum, device_weights, host_checksums, weights_length

    ids = torch.randint(0, 150_000, (2, 37), generator=torch.Generator().manual_seed(0))
    table = host_checksums({"input_ids": ids})
    n = weights_length({"input_ids": ids})

    def checksum(values, table):
        return _checksum(values, device_weights(table, n))

    torch._dynamo.reset()
    compiled = torch.compile(checksum, fullgraph=True)(ids, table)
    torch._dynamo.reset()
    assert compiled == table[0] == checksum(ids, table)


@settings(max_examples=60, deadline=None)
@given(tensors=st.lists(st.tuples(st.sampled_from([torch.int64, torch.int32, torch.bool, torch.float32]),
                                  st.lists(st.integers(-2**40, 2**40) | st.integers(0, 5), min_size=0, max_size=40)),
                        min_size=1, max_size=4))
def test_each_sum_in_the_table_is_the_keyed_checksum_of_its_halves(tensors):
    """Every entry of ``host_checksums``' table (which takes small non-negative values by the even weights alone) is
    the general keyed checksum of that tensor's halves with the plan's weights, as the device computes it: values
    small and large, negative, booleans, floats, empty tensors."""
    from syncfree.plan.checksum import host_checksums

    host = {}
    for i, (dtype, values) in enumerate(tensors):
        t = torch.tensor(values, dtype=torch.int64)
        if dtype is torch.bool:
            t = t % 2 == 1
        elif dtype is torch.int32:
            t = t.clamp(-2**31, 2**31 - 1).to(torch.int32)
        elif dtype is torch.float32:
            t = t.to(torch.float32)
        host[f"t{i}"] = t
    table = host_checksums(host)
    weights = device_weights(table, max(2 * t.numel() for t in host.values())).numpy()
    for i, t in enumerate(host.values()):
        assert int(table[i]) == _host_checksum(t, weights)


@pytest.mark.parametrize("edited", [None, "input_ids", "image_grid_thw", "second_per_grid_ts"])
def test_a_traced_check_sums_tensors_of_every_length_in_one_group_and_finds_the_edited_one(edited):
    """In a traced forward the tensors of a device are checked as one group (each padded to the longest: one
    reduction, one compiled kernel): each tensor's own checksum, whatever its length and dtype, so only the edited
    one, shorter or longest, fails its check."""
    from syncfree.plan.checksum import _checksums_equal, host_checksums, weights_length

    gen = torch.Generator().manual_seed(1)
    host = {"input_ids": torch.randint(0, 150_000, (2, 37), generator=gen),
            "image_grid_thw": torch.tensor([[1, 4, 6], [2, 8, 8]]),
            "second_per_grid_ts": torch.rand(3, generator=gen)}
    table = host_checksums(host)
    given = {name: value.clone() for name, value in host.items()}
    if edited is not None:
        given[edited].view(-1)[-1] += 1
    group = [(i, name, given[name]) for i, name in enumerate(host)]
    n = weights_length(host)

    def checks(*values):
        weights = device_weights(table, n)
        return torch.stack(_checksums_equal([(i, name, v) for (i, name, _), v in zip(group, values)], table, weights))

    torch._dynamo.reset()
    traced = torch.compile(checks, fullgraph=True, backend="aot_eager")(*given.values())
    torch._dynamo.reset()
    assert traced.tolist() == [name != edited for name in host]
