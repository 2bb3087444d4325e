"""Models from presets or local checkpoint folders: ``load_config``, ``build_model``, ``build_vision_model``.

Nothing is downloaded: presets (each family group's ``PRESETS``) build random-weight models from their
config values; a local checkpoint folder (one holding ``config.json``) is loaded from disk.
"""

from __future__ import annotations

import copy
import difflib
import os

import torch

from . import FAMILIES, MODEL_CLASSES, PRESETS, VISION_CLASSES

__all__ = ["load_config", "build_model", "build_vision_model", "vision_tower_of"]


def _looks_like_a_path(model: str) -> bool:
    return os.sep in model or "/" in model or model.startswith((".", "~"))


def _checkpoint_model_type(folder: str) -> str:
    """The ``model_type`` a checkpoint folder declares; a ValueError saying what is wrong with the folder otherwise."""
    import json

    path = os.path.join(folder, "config.json")
    try:
        with open(path) as f:
            values = json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err})") from None
    model_type = values.get("model_type") if isinstance(values, dict) else None
    if model_type not in FAMILIES:
        what = f"model type {model_type!r}" if model_type else "no model_type"
        raise ValueError(f"{path} declares {what}, which syncfree does not support; supported model types: "
                         f"{', '.join(FAMILIES)}")
    return model_type


def _did_you_mean(name: str) -> str:
    """`` (did you mean 'x'?)`` for the preset closest to ``name`` (difflib), or nothing where none is close."""
    close = difflib.get_close_matches(name, list(PRESETS), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def load_config(model: str, text_layers: int | None = None, attn: str = "sdpa"):
    """A Transformers config for a preset name or a local checkpoint folder.

    ``text_layers`` shortens the text model (its widths stay real), so the full
    forward of a large preset fits a small machine; the vision tower is never shortened.
    A ``ValueError`` says what is wrong with anything else: a name that is no preset and no
    folder, a folder without ``config.json``, or a model type syncfree does not patch.
    """
    from transformers import AutoConfig

    if model in PRESETS:
        values = copy.deepcopy(PRESETS[model].values)
        model_type = values.pop("model_type")
        config = AutoConfig.for_model(model_type, **values)
        config.text_config.pad_token_id = PRESETS[model].pad_token_id
    elif os.path.isdir(model):
        if not os.path.isfile(os.path.join(model, "config.json")):
            raise ValueError(f"model folder {model!r} holds no config.json; a checkpoint folder needs one (as "
                             "save_pretrained writes it)")
        _checkpoint_model_type(model)  # before Transformers reads it: its error for a BERT folder comes much later
        config = AutoConfig.from_pretrained(model, local_files_only=True)
    elif os.path.exists(model):
        raise ValueError(f"model {model!r} is a file; give a preset (`syncfree presets` lists them) or a "
                         "checkpoint folder that holds a config.json")
    elif _looks_like_a_path(model):
        raise ValueError(f"model folder {model!r} does not exist (and it is no preset{_did_you_mean(model)}: "
                         "`syncfree presets` lists them); nothing is downloaded, so a Hub checkpoint must be "
                         "downloaded first and its folder given")
    else:
        raise ValueError(f"unknown model {model!r}: no preset{_did_you_mean(model)} and no folder of that name "
                         "(nothing is downloaded); `syncfree presets` lists the presets")
    if text_layers is not None:
        if text_layers < 1:
            raise ValueError(f"text_layers must be at least 1, got {text_layers}")
        if text_layers > config.text_config.num_hidden_layers:  # it shortens; it never adds random layers
            raise ValueError(f"text_layers={text_layers} is more than the {config.text_config.num_hidden_layers} "
                             f"text layers of {model}; it can only shorten the text model")
        config.text_config.num_hidden_layers = text_layers
    config._attn_implementation = attn
    for sub in ("vision_config", "text_config", "audio_config"):
        if getattr(config, sub, None) is not None:
            getattr(config, sub)._attn_implementation = attn
    return config


def _attn_implementation(config, attn: str):
    """``attn`` for every sub-model, or where the family's text model has only one implementation (a preset's
    ``text_attn``), that one for the text model (and the outer model, which holds no attention of its own)."""
    only = next((p.text_attn for p in PRESETS.values() if p.text_attn and p.values["model_type"] == config.model_type),
                None)
    if only is None or only == attn:
        return attn
    config.text_config._attn_implementation = only
    return {"": only, "text_config": only, "vision_config": attn}


def build_model(model: str = "qwen3-vl-tiny", *, attn: str = "sdpa", dtype: torch.dtype = torch.float32,
                text_layers: int | None = None, seed: int = 0, device: str | torch.device = "cpu"):
    """A ``*ForConditionalGeneration`` model in eval mode, on ``device`` (the CPU by default).

    Presets get random weights drawn from ``seed`` (on a GPU they are drawn there: building an
    8B-shaped model on the host first would take longer than benchmarking it); a checkpoint
    folder is loaded from disk.
    """
    from transformers import AutoModelForImageTextToText

    config = load_config(model, text_layers=text_layers, attn=attn)
    attn = _attn_implementation(config, attn)
    if model not in PRESETS:
        return AutoModelForImageTextToText.from_pretrained(
            model, config=config, dtype=dtype, local_files_only=True, attn_implementation=attn
        ).to(device).eval()
    device = torch.device(device)
    # Draw from the seed without disturbing the caller's random state, on the host or the GPU.
    fork = {"devices": [device.index or 0], "device_type": "cuda"} if device.type == "cuda" else {"devices": []}
    with torch.random.fork_rng(**fork), device:
        torch.manual_seed(seed)
        if config.model_type in MODEL_CLASSES:  # e.g. an Omni thinker: no auto class builds one from its config
            m = MODEL_CLASSES[config.model_type](config.model_type)._from_config(config, dtype=dtype,
                                                                                 attn_implementation=attn)
        else:
            m = AutoModelForImageTextToText.from_config(config, dtype=dtype, attn_implementation=attn)
    return m.eval()


def build_vision_model(model: str = "qwen3-vl-tiny", *, attn: str = "sdpa", dtype: torch.dtype = torch.float32,
                       seed: int = 0):
    """Only the vision tower; for a preset, without building the text model."""
    import importlib

    if model not in PRESETS:
        return vision_tower_of(build_model(model, attn=attn, dtype=dtype))
    config = load_config(model, attn=attn)
    layout = FAMILIES[config.model_type].layout
    module = importlib.import_module(layout.tower.modeling or layout.modeling)  # (GLM-4.6V: GLM-4.1V's tower)
    cls = getattr(module, VISION_CLASSES[config.model_type])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = cls._from_config(config.vision_config, dtype=dtype, attn_implementation=attn)
    return m.eval()


def vision_tower_of(model):
    """The vision tower of a multimodal model (``*ForConditionalGeneration`` or its inner ``*Model``): ``visual`` in
    the Qwen-VL families, ``vision_tower`` in ERNIE-4.5-VL, ``vision_model`` in VideoLLaMA3; an Omni thinker in 5.17
    holds it itself."""
    for holder in (getattr(model, "model", None), model):
        for name in ("visual", "vision_tower", "vision_model"):
            tower = getattr(holder, name, None)
            if isinstance(tower, torch.nn.Module):
                return tower
    raise ValueError(f"{type(model).__name__} holds no vision tower (no visual or vision_tower module)")
