"""The report (table, JSON, grouping) and assert_no_sync."""

from __future__ import annotations

import json

import pytest
import torch

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
    assert data["summary"] == {"engine": "emulated", "syncs": 3, "h2d": 1, "d2h": 0, "blocking_copies": 1,
                               "lines": 2}
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
