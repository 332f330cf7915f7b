"""Vision-language models: images in prompts and tool results, token-exact (see docs/vision.md).

- :class:`VisionTemplate`: a processor and its chat template; :meth:`~VisionTemplate.prompt` and
  :meth:`~VisionTemplate.suffix_ids` give token IDs with each image's placeholder expanded by the
  processor itself, and the image inputs that go with them;
- :class:`ImageInputs`: those image inputs (``pixel_values``, ``image_grid_thw``...) aligned with
  the placeholder runs, never in the loss mask; a trainer rebuilds the model inputs from it;
- :func:`image_only_processor`: a transformers processor without its video/audio parts (whose
  classes need torchvision); :func:`split_images`, :func:`load_image`: image content parts.

Pillow is needed (``pip install 'tmpl[vision]'``); it is imported when an image is read.

>>> import tmpl.vision
>>> sorted(tmpl.vision.__all__)[:3]
['ImageInputs', 'VisionIds', 'VisionTemplate']
"""

from __future__ import annotations

from .inputs import ImageInputs, placeholder_runs
from .parts import load_image, split_images
from .template import VisionIds, VisionTemplate, image_only_processor

__all__ = [
    "ImageInputs",
    "VisionIds",
    "VisionTemplate",
    "image_only_processor",
    "load_image",
    "placeholder_runs",
    "split_images",
]
