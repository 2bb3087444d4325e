"""The benchmark scenarios: one definition each, shared by ``syncfree bench`` and the GPU script.

Pixel sizes are multiples of 224, which every Qwen-VL family accepts (28 = 14 x 2 for
Qwen2/2.5-VL, 32 = 16 x 2 for Qwen3-VL). ``scale`` shrinks every side (rounded to the
model's unit) for quick runs, and ``frames`` caps video length there; the layout — how
many images, frames and requests — never changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..inputs import Audio, Image, Item, Text, Video, VideoWithAudio

__all__ = ["Scenario", "SCENARIOS", "MODELS", "QUICK_MODELS"]


@dataclass(frozen=True)
class Scenario:
    name: str
    about: str
    requests: tuple  # per request: a tuple of ("text", n) / ("image", side_h, side_w) / ("video", frames, h, w)
    #                  / ("audio", mel frames) / ("video+audio", frames, h, w, mel frames): Omni thinkers only

    @property
    def audio(self) -> bool:
        """True when the scenario feeds audio (only an Omni thinker takes it)."""
        return any(item[0] in ("audio", "video+audio") for request in self.requests for item in request)

    @property
    def pixels(self) -> bool:
        """True when the scenario has an image or a video (something for the vision tower)."""
        return any(item[0] in ("image", "video", "video+audio") for request in self.requests for item in request)

    def samples(self, unit: int, scale: float = 1.0, max_frames: int | None = None) -> list[list[Item]]:
        def px(side: int) -> int:
            return max(unit, round(side * scale / unit) * unit)

        out = []
        for request in self.requests:
            items: list[Item] = []
            for kind, *args in request:
                if kind == "text":
                    items.append(Text(args[0]))
                elif kind == "image":
                    items.append(Image(px(args[0]), px(args[1])))
                elif kind == "audio":  # 100 mel frames a second; scaled like a side, at least one second
                    items.append(Audio(max(100, round(args[0] * scale))))
                elif kind == "video+audio":  # one frame a second, so the clip spans the frames
                    frames = args[0] if max_frames is None else min(args[0], max_frames)
                    items.append(VideoWithAudio(Video(frames, px(args[1]), px(args[2]), fps=1.0),
                                                Audio(max(100, round(args[3] * scale)))))
                else:
                    frames = args[0] if max_frames is None else min(args[0], max_frames)
                    items.append(Video(frames, px(args[1]), px(args[2])))
            out.append(items)
        return out

    def smallest(self, unit: int) -> list[list[Item]]:
        """The same layout at the smallest pixel size: host syncs depend on the layout, not on pixel counts."""
        return self.samples(unit, scale=1e-9)


def _image(side: int) -> tuple:
    return ("image", side, side)


_PROMPT, _QUESTION = ("text", 12), ("text", 20)

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("image-448", "one 448x448 image", ((_PROMPT, _image(448), _QUESTION),)),
    Scenario("image-896", "one 896x896 image", ((_PROMPT, _image(896), _QUESTION),)),
    Scenario("image-1344", "one 1344x1344 image", ((_PROMPT, _image(1344), _QUESTION),)),
    Scenario("images-8x224", "8 images of 224x224 in one request",
             ((_PROMPT,) + tuple(x for _ in range(8) for x in (_image(224), ("text", 2))) + (_QUESTION,),)),
    Scenario("video-16x448", "one video, 16 frames of 448x448", ((_PROMPT, ("video", 16, 448, 448), _QUESTION),)),
    Scenario("image+video", "a 448x448 image and an 8-frame 224x224 video",
             ((_PROMPT, _image(448), ("text", 4), ("video", 8, 224, 224), _QUESTION),)),
    Scenario("batch-4", "4 requests with 1, 2, 3 and 4 images of 224-672 px (left-padded)", (
        (_PROMPT, _image(448), _QUESTION),
        (_PROMPT, _image(224), ("text", 2), ("image", 448, 672), _QUESTION),
        (_PROMPT, _image(672), ("text", 2), _image(224), ("text", 2), ("image", 224, 448), _QUESTION),
        (_PROMPT,) + tuple(x for _ in range(4) for x in (_image(224), ("text", 2))) + (_QUESTION,),
    )),
    # Omni thinkers (audio): a 30-second clip, and an 8-second 448x448 video with its audio track.
    Scenario("audio-30s", "one 30-second audio clip", ((_PROMPT, ("audio", 3000), _QUESTION),)),
    Scenario("video+audio", "an 8-frame 448x448 video with its 8-second audio track",
             ((_PROMPT, ("video+audio", 8, 448, 448, 800), _QUESTION),)),
)}

# Real vision shapes; the text model keeps its widths but is cut to a few layers for the full scope
# (the text model is not what syncfree changes, and the full 8B text model does not fit a small machine).
MODELS = ("qwen3-vl-2b", "qwen3-vl-8b", "qwen2.5-vl-7b")
QUICK_MODELS = ("qwen3-vl-tiny", "qwen2.5-vl-tiny")
