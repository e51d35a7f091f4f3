"""Compatibility shims for transformers, with no project imports (so the tiny builders and
the loading code can both use them without an import cycle)."""
from __future__ import annotations


def allow_video_processors_without_torchvision() -> None:
    """Let processors that carry a video processor (Qwen2-VL, LLaVA-OneVision, InternVL)
    be built and loaded when ``torchvision`` is absent.

    Why: transformers only exports ``VideoProcessorMixin`` when torchvision is installed, so
    such processors fail their class check even for image-only use. With the name exported,
    a checkpoint whose video processor is the plain mixin (our tiny ones) loads; a real
    checkpoint's torchvision video processor still needs ``pip install torchvision``.
    No-op when torchvision is installed.
    """
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        return
    import transformers
    from transformers import processing_utils
    from transformers.video_processing_utils import VideoProcessorMixin

    for module in (transformers, processing_utils.transformers_module):
        if not hasattr(module, "VideoProcessorMixin"):
            setattr(module, "VideoProcessorMixin", VideoProcessorMixin)
