"""What emulate_cuda() changes stays in the threads that emulate: other threads keep PyTorch's module-swap
setting, and a DataLoader's pin-memory thread, which pins for an emulating thread, emulates with it."""

from __future__ import annotations

import threading

import torch
from torch.utils.data import DataLoader

from syncfree.audit import emulate_cuda


def test_another_thread_keeps_its_own_module_swap_setting():
    getter = torch.__future__.get_swap_module_params_on_conversion
    inside, done, seen = threading.Event(), threading.Event(), {}

    def other():
        inside.wait(60)
        seen["swap"] = torch.__future__.get_swap_module_params_on_conversion()
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with emulate_cuda():
        assert torch.__future__.get_swap_module_params_on_conversion()  # model.to() swaps parameters here
        inside.set()
        assert done.wait(60)
    thread.join()
    assert seen["swap"] is False
    assert torch.__future__.get_swap_module_params_on_conversion is getter  # restored on exit


def test_a_dataloader_pins_in_its_own_thread_inside_emulation():
    data = [torch.arange(4) + i for i in range(6)]
    with emulate_cuda():
        batches = list(DataLoader(data, batch_size=2, num_workers=1, pin_memory=True))
        assert all(b.is_pinned() for b in batches)
    assert torch.equal(torch.cat(batches), torch.stack(data))
