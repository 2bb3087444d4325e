"""The report (table, JSON, grouping) and assert_no_sync."""

from __future__ import annotations

import json

import pytest
import torch

import syncfree
from syncfree import SyncError, assert_no_sync
from syncfree.audit import emulate_cuda


def _two_lines():
    x = torch.arange(4, device="cuda")
    for _ in range(3):
        x.sum().item()  # three syncs, one line
    torch.tensor([1, 2], device="cuda")  # one blocking copy


def test_events_are_grouped_by_source_line_in_order(emulated):
    report = emulated(_two_lines)
    lines = list(report.by_line().values())
    assert [(s.syncs, s.h2d, s.blocking_copies) for s in lines] == [(3, 0, 0), (0, 1, 1)]
    assert lines[0].code == "x.sum().item()  # three syncs, one line"
    assert lines[0].function == "_two_lines"


def test_table_lists_each_line_and_the_totals(emulated):
    table = emulated(_two_lines).table()
    assert "x.sum().item()" in table and "torch.tensor([1, 2]" in table
    assert table.splitlines()[-1].startswith("total (emulated): 3 syncs, 1 host-to-device")


def test_json_round_trips_with_summary_lines_and_events(emulated):
    data = json.loads(emulated(_two_lines).to_json())
    launches = data["summary"].pop("launches")
    assert data["summary"] == {"engine": "emulated", "syncs": 3, "h2d": 1, "d2h": 0, "blocking_copies": 1,
                               "lines": 2}
    assert isinstance(launches, int) and launches > 0 and sum(data["launch_ops"].values()) == launches
    assert len(data["events"]) == 4 and len(data["lines"]) == 2
    first = data["events"][0]
    assert first["kind"] == "sync" and first["op"] == "aten::_local_scalar_dense"
    assert first["line"].endswith(f":{first['stack'][0].split(':')[1].split()[0]}")


def test_assert_no_sync_passes_for_sync_free_code():
    with emulate_cuda():
        x = torch.arange(4, device="cuda")
        with assert_no_sync() as report:
            y = torch.repeat_interleave(x, x, output_size=6)
            torch.ones(3).pin_memory().to("cuda", non_blocking=True)
        assert report.syncs == [] and y.shape == (6,)


def test_assert_no_sync_fails_listing_every_offending_line():
    with emulate_cuda():
        with pytest.raises(SyncError) as caught:
            with assert_no_sync():
                _two_lines()
    message = str(caught.value)
    assert "got 3 syncs and 1 blocking copies" in message
    assert "x.sum().item()" in message and "torch.tensor([1, 2]" in message
    assert isinstance(caught.value, AssertionError) and len(caught.value.report.events) == 4


def test_assert_no_sync_limits_allow_a_known_number():
    with emulate_cuda():
        with assert_no_sync(max_syncs=3, max_blocking_copies=1):
            _two_lines()
        with pytest.raises(SyncError, match="at most 2 host syncs"):
            with assert_no_sync(max_syncs=2, max_blocking_copies=1):
                _two_lines()


# ---- which frames an event names ----------------------------------------------------------------------
def _frames_of(fn, path: str, name: str = "<module>"):
    """Run ``fn`` from a frame that claims to be ``name`` in ``path``; return the stack of its one sync."""
    import os

    from syncfree.audit import audit as audit_

    os.makedirs(os.path.dirname(path), exist_ok=True)
    if name == "<module>":
        code = compile("fn()", path, "exec")
        call = lambda: exec(code, {"fn": fn})  # noqa: E731
    else:
        scope: dict = {}
        exec(compile(f"def {name}(fn):\n    return fn()\n", path, "exec"), scope)
        call = lambda: scope[name](fn)  # noqa: E731
    with emulate_cuda(), audit_() as report:
        call()
    (event,) = report.syncs
    return [f.filename for f in event.stack], event


def _sync():
    torch.ones(2, device="cuda").tolist()


def test_a_console_scripts_entry_line_is_not_a_source_line(tmp_path):
    import os
    import sysconfig

    script = os.path.join(sysconfig.get_path("scripts"), "syncfree-test-entry-point")
    files, event = _frames_of(_sync, script)
    assert script not in files and event.where.function == "_sync"
    elsewhere = str(tmp_path / "entry.py")  # a <module> frame outside bin/ is the user's own script: kept
    assert elsewhere in _frames_of(_sync, elsewhere)[0]


@pytest.mark.parametrize("tail,function,skipped", [
    ("transformers/utils/generic.py", "wrapper", True),
    ("transformers/utils/output_capturing.py", "wrapper", True),
    ("transformers/utils/deprecation.py", "wrapped_func", True),
    ("transformers/modeling_layers.py", "forward_with_checkpointing", True),
    ("transformers/modeling_layers.py", "forward", False),
    ("transformers/modeling_rope_utils.py", "wrapper", True),
    ("transformers/masking_utils.py", "wrapper", False),
])
def test_transformers_pass_through_wrappers_are_skipped_and_nothing_else(tmp_path, tail, function, skipped):
    path = str(tmp_path / "site-packages" / tail)
    files, event = _frames_of(_sync, path, function)
    assert (path not in files) is skipped
    assert event.where.function == "_sync"


def test_a_stock_forward_names_no_decorator_frames():
    # Transformers' decorators wrap every forward (5.17 and the newest release alike): none may show.
    from syncfree.inputs import build_inputs, named_layout
    from syncfree.presets import build_model, load_config

    config = load_config("qwen3-vl-tiny")
    batch = build_inputs(config, named_layout("image", 64))
    model = build_model("qwen3-vl-tiny", text_layers=1)
    with emulate_cuda(), torch.no_grad():
        model.to("cuda")
        with syncfree.audit() as report:
            model(**{k: v.to("cuda") for k, v in batch.items()})
        model.to("cpu")
    frames = [f for e in report.events for f in e.stack]
    assert report.syncs and frames
    wrappers = ("utils/generic.py", "utils/output_capturing.py", "utils/deprecation.py")
    assert not [str(f) for f in frames if f.filename.replace("\\", "/").endswith(wrappers)]
    assert {"get_image_features", "forward"} <= {f.function for f in frames}  # the model's own frames stay
