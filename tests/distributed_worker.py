"""What each rank runs in tests/test_distributed.py (a module of its own: spawned processes import it).

Each rank builds the same tiny Qwen3-VL (seeded), takes its own micro-batch, and runs one forward and
backward under DDP or FSDP2 on gloo, stock and patched; it reports losses, full gradients and state
dict keys to the parent through a queue.
"""

from __future__ import annotations

import io
import os

import torch
import torch.distributed as dist

PRESET = "qwen3-vl-tiny"


def layouts():
    from syncfree.inputs import Image, Text, Video

    return {
        "image+video": [[Text(3), Image(64, 64), Text(2)], [Text(4), Video(2, 64, 32), Text(1)]],
        "images": [[Image(32, 32), Text(5)], [Text(2), Image(64, 32), Text(3)]],
        "image+video-2": [[Image(32, 32), Text(5)], [Text(2), Video(2, 32, 32), Text(3)]],
        "text-only": [[Text(9)], [Text(5)]],
    }


def batch_for(layout: str) -> dict:
    from syncfree.compare.train import labels_for
    from syncfree.inputs import build_inputs
    from syncfree.presets import PRESETS, load_config

    batch = build_inputs(load_config(PRESET), layouts()[layout], pad_token_id=PRESETS[PRESET].pad_token_id)
    batch["labels"] = labels_for(batch)
    return batch


def hand_written_dummy(model) -> None:
    """The dummy-vision-forward workaround as training frameworks write it (the reference): when a micro-batch
    lacks a modality, run the tower on a small input and add its outputs times zero to the text input."""
    visual = model.model.visual

    def add(module, args, kwargs):
        missing = 2 - (module._pixels is not None) - (module._videos is not None)
        zero = 0.0
        for _ in range(missing):
            merge = visual.config.spatial_merge_size
            width = visual.config.in_channels * visual.config.temporal_patch_size * visual.config.patch_size ** 2
            out = visual(torch.zeros(merge * merge, width), grid_thw=torch.tensor([[1, merge, merge]]))
            flat = []
            for value in (out.to_tuple() if hasattr(out, "to_tuple") else out):
                flat += list(value) if isinstance(value, (list, tuple)) else [value]
            zero = zero + sum(t.sum() for t in flat if isinstance(t, torch.Tensor)) * 0
        kwargs["inputs_embeds"] = kwargs["inputs_embeds"] + zero
        return args, kwargs

    model.model.language_model.register_forward_pre_hook(add, with_kwargs=True)


def _shard(model, world: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for block in model.model.visual.blocks:
        fully_shard(block, mesh=mesh)
    for layer in model.model.language_model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _save_and_reload(model, variant: str, world: int, checkpoint_dir: str) -> dict:
    """Save the sharded model with torch.distributed.checkpoint, load it into a freshly built (differently
    seeded) sharded model of the same variant, and return both state dicts (full tensors)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    import syncfree
    from syncfree.presets import build_model

    saved = get_model_state_dict(model)
    dcp.save(saved, checkpoint_id=checkpoint_dir)
    fresh = build_model(PRESET, dtype=torch.float32, seed=1).train()
    if variant != "stock":
        syncfree.patch(fresh)
    _shard(fresh, world)
    loaded = get_model_state_dict(fresh)
    dcp.load(loaded, checkpoint_id=checkpoint_dir)
    set_model_state_dict(fresh, loaded)
    return {"saved": {k: _full(v) for k, v in get_model_state_dict(model).items()},
            "loaded": {k: _full(v) for k, v in get_model_state_dict(fresh).items()},
            "patched": syncfree.is_patched(fresh)}


def step(engine: str, variant: str, layout: str, world: int, checkpoint_dir: str | None = None) -> dict:
    import syncfree
    from syncfree.presets import build_model

    model = build_model(PRESET, dtype=torch.float32, seed=0).train()
    batch = batch_for(layout)
    if variant == "dummy":
        model.model.language_model._pixels = batch.get("pixel_values")
        model.model.language_model._videos = batch.get("pixel_values_videos")
        hand_written_dummy(model)
    elif variant != "stock":
        syncfree.patch(model, vision_every_step=variant == "patched+vision")
        batch = syncfree.prepare(batch, "cpu", model)
    if engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model)
    else:
        wrapped = _shard(model, world)
    loss = wrapped(**batch).loss
    loss.backward()
    if checkpoint_dir is not None:
        return {"loss": loss.detach(), "grads": {}, "state": {}, "reloaded": _save_and_reload(model, variant, world,
                                                                                              checkpoint_dir)}
    return {"loss": loss.detach(),
            "grads": {n: _full(p.grad) for n, p in model.named_parameters() if p.grad is not None},
            "state": {k: _full(v) for k, v in model.state_dict().items()}}


def run(rank: int, world: int, port: int, jobs: list, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = [step(engine, variant, layouts_by_rank[rank], world, *extra)
                   for engine, variant, layouts_by_rank, *extra in jobs]
        # As bytes: tensors put on a torch.multiprocessing queue are shared through this process, which
        # is gone by the time the parent reads them.
        buffer = io.BytesIO()
        torch.save(results, buffer)
        queue.put((rank, buffer.getvalue(), None))
    except Exception as err:  # noqa: BLE001  (sent to the parent, which fails the test with it)
        queue.put((rank, None, f"{type(err).__name__}: {err}"))
    finally:
        dist.destroy_process_group()
