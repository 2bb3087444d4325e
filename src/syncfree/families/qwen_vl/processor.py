"""An offline processor for the Qwen-VL presets: the family's own processor class and image processor, with a
word-level tokenizer whose special tokens sit at the config's ids. Nothing is downloaded.

This is what training and inference clients (TRL's trainers, ``pipeline("image-text-to-text")``) need besides the
model: a processor that turns chat messages with images into the batch the model takes, as the published one does
(the same placeholder expansion, grids and pixel layout), only with a small vocabulary. Transformers' own tests
build processors offline the same way.

    processor = build_processor("qwen3-vl-tiny")
    batch = processor.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt")

Images only: the video processors need torchvision, so the processor is built without one.
"""

from __future__ import annotations

import importlib

__all__ = ["build_processor", "PROCESSOR_CLASSES", "CHAT_TEMPLATE", "WORDS"]

# model_type -> (module, processor class): the classes the published checkpoints name.
PROCESSOR_CLASSES = {
    "qwen2_vl": ("transformers.models.qwen2_vl.processing_qwen2_vl", "Qwen2VLProcessor"),
    "qwen2_5_vl": ("transformers.models.qwen2_5_vl.processing_qwen2_5_vl", "Qwen2_5_VLProcessor"),
    "qwen3_vl": ("transformers.models.qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor"),
    "qwen3_vl_moe": ("transformers.models.qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor"),
    "qwen3_5": ("transformers.models.qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor"),
    "qwen3_5_moe": ("transformers.models.qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor"),
}

# The published Qwen-VL chat format, shortened to what text-and-image chats use.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Words the tokenizer knows by name (every other id decodes as ``w<id>``).
WORDS = tuple("a an the is are what which where who in on of to and or it this that there image picture photo "
              "describe color colour shape red green blue yellow black white cat dog bird car tree house sky sea "
              "one two three four five yes no left right top bottom big small user assistant system".split())

_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 (0: the presets' padding id)


def _tokenizer(config, words: tuple[str, ...]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    size = config.text_config.vocab_size
    placeholders = {"<|image_pad|>": config.image_token_id, "<|video_pad|>": config.video_token_id,
                    "<|vision_start|>": config.vision_start_token_id, "<|vision_end|>": config.vision_end_token_id}
    taken = {i: t for t, i in placeholders.items()} | dict(enumerate(_SPECIAL))
    if len(taken) != len(placeholders) + len(_SPECIAL) or max(taken) >= size:
        raise ValueError(f"build_processor: the config's placeholder ids {sorted(placeholders.values())} must be "
                         f"distinct, above {len(_SPECIAL) - 1} and below the vocabulary size {size}")
    free = (i for i in range(size) if i not in taken)
    vocab = {token: i for i, token in taken.items()}
    for word, i in zip(words, free):
        vocab[word] = i
    vocab.update({f"w{i}": i for i in free})  # every id decodes to something
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>", unk_token="<|endoftext|>",
                                   eos_token="<|im_end|>", padding_side="left",
                                   extra_special_tokens=[t for t in (*_SPECIAL, *placeholders) if t != "<|endoftext|>"])


def _image_processor(config, max_side: int):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    vc = config.vision_config
    unit = vc.patch_size * vc.spatial_merge_size
    # Qwen3-VL's checkpoints normalize to [-1, 1]; Qwen2-VL's and Qwen2.5-VL's use CLIP's mean and std.
    norm = {} if config.model_type.startswith("qwen2") else {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    return Qwen2VLImageProcessorPil(patch_size=vc.patch_size, temporal_patch_size=vc.temporal_patch_size,
                                    merge_size=vc.spatial_merge_size, min_pixels=unit * unit,
                                    max_pixels=max_side * max_side, **norm)


def _image_only(cls):
    """The family's processor class, accepting no video processor (the published one needs torchvision)."""

    class ImageOnly(cls):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument is None and argument_name == "video_processor":
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    ImageOnly.__name__ = ImageOnly.__qualname__ = cls.__name__
    return ImageOnly


def build_processor(config, *, words: tuple[str, ...] = WORDS, max_side: int | None = None):
    """The family's processor for ``config`` (a Qwen-VL config, e.g. ``load_config("qwen3-vl-tiny")``), built
    offline: a word-level tokenizer (``words`` by name, special tokens at the config's ids, padding on the left
    as for generation) and the family's image processor (its patch, merge and temporal patch sizes; images are
    resized to at most ``max_side * max_side`` pixels, 4 x 4 merged patches by default). Images only."""
    if config.model_type not in PROCESSOR_CLASSES:
        raise ValueError(f"build_processor builds Qwen-VL processors ({', '.join(PROCESSOR_CLASSES)}), not "
                         f"{config.model_type!r}")
    module, name = PROCESSOR_CLASSES[config.model_type]
    cls = _image_only(getattr(importlib.import_module(module), name))
    vc = config.vision_config
    max_side = max_side or 4 * vc.patch_size * vc.spatial_merge_size
    return cls(image_processor=_image_processor(config, max_side), tokenizer=_tokenizer(config, words),
               video_processor=None, chat_template=CHAT_TEMPLATE)
