"""GLM-Image's VQ codes of its source images as one operator, in a traced forward of a stream.

``get_image_tokens`` encodes each source image's features with the frozen VQ-VAE (``self.vqmodel.encode`` per image:
its 1x1 ``quant_conv``, then the quantizer's nearest codebook entry) and concatenates the codes. In a stream's graph
each image's height and width are sizes (``PlanHooks.item_sizes``), and Inductor's CPU lowering of the quantizer's
distance product asks whether an image is a single token (an unbacked size it cannot answer: the graph would fail to
compile). Inside one operator the same calls run on the real tensors: ``nn.Conv2d``'s own ``F.conv2d`` with its
defaults, stock's quantizer ``forward`` on a stand-in holding the codebook; the same codes. They are integers (an
``argmin``): no gradient flows through them, in stock as here, so the operator has no backward.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from ...rewrite.recomputed_op import class_path, stock_class
from .image_ids import traced_item_sizes

__all__ = ["codes_in_one_op", "image_codes"]


@torch.library.custom_op("syncfree::glm_image_codes", mutates_args=())
def _codes(features: list[torch.Tensor], conv_weight: torch.Tensor, conv_bias: torch.Tensor | None,
           codebook: torch.Tensor, quantizer: str, beta: float) -> torch.Tensor:
    """Stock's loop: each image's ``encode`` (``quant_conv``, then the quantizer), its codes concatenated."""
    forward = stock_class(quantizer).forward
    module = types.SimpleNamespace(embedding=types.SimpleNamespace(weight=codebook),
                                   embedding_dim=codebook.shape[-1], beta=beta)
    with torch.no_grad():
        return torch.cat([forward(module, F.conv2d(hs[None, ...], conv_weight, conv_bias))[2] for hs in features],
                         dim=0)


@_codes.register_fake
def _(features, conv_weight, conv_bias, codebook, quantizer, beta):
    # (one code per position of each image: its height times its width, sizes the graph keeps symbolic)
    return features[0].new_empty((sum(hs.shape[-2] * hs.shape[-1] for hs in features),), dtype=torch.long)


def codes_in_one_op(vqmodel, features) -> bool:
    """Whether ``get_image_tokens`` of ``features`` runs as one operator: in a traced forward whose plan hands each
    image's sides as sizes (a stream's), with a tensor per image and the VQ-VAE's plain 1x1 convolution."""
    return (isinstance(features, (list, tuple)) and bool(features) and _plain_conv(getattr(vqmodel, "quant_conv", None))
            and traced_item_sizes() is not None)


def _plain_conv(conv) -> bool:
    # (what ``F.conv2d(x, weight, bias)`` computes: nn.Conv2d's call with these defaults, GLM-Image's 1x1 quant_conv)
    return (isinstance(conv, torch.nn.Conv2d) and conv.stride == (1, 1) and conv.padding == (0, 0)
            and conv.dilation == (1, 1) and conv.groups == 1 and conv.padding_mode == "zeros")


def image_codes(vqmodel, features) -> torch.Tensor:
    """``torch.cat([vqmodel.encode(hs[None, ...]).image_tokens for hs in features])`` as one operator (see the
    module)."""
    conv, quantizer = vqmodel.quant_conv, vqmodel.quantize
    return _codes(list(features), conv.weight, conv.bias, quantizer.embedding.weight, class_path(type(quantizer)),
                  float(quantizer.beta))
