"""What the Hugging Face mixins share, declared once: the state ``HFBaseInterface`` and
``HFLoadingMixin`` set up (the model, processor, tokenizer, device, dtype, path, context
length) and the methods one mixin calls on another (``models.hf_base`` assembles them).

Why a base of declarations: each mixin is read, and type-checked, on its own; without this a
checker sees ``self.tokenizer`` in ``HFGenerationMixin`` as an attribute nobody has. Nothing here
runs: the attributes are annotations only, and the class and its methods are what the checker
sees (``TYPE_CHECKING``); at run time ``HFState`` is an empty class, so the order of the mixins
in ``HFBaseInterface`` decides, as before, which definition runs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

if TYPE_CHECKING:
    import torch
    from PIL import Image

    from .hub_cache import HubSnapshot
    from .interfaces.base_interface import BaseInterface as _Interface
else:
    _Interface = object


class HFState(_Interface):
    """The attributes every HF mixin may use (set by ``HFBaseInterface.__init__`` and
    ``HFLoadingMixin``), and the cross-mixin methods' signatures."""

    model: Any
    processor: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    model_path: str
    max_context: Optional[int]
    hub_snapshot: Optional[HubSnapshot]
    chat_response_prefix: Optional[str]
    _sample_ids: Optional[List[Any]]
    _traces: Optional[List[Dict[str, Any]]]

    if TYPE_CHECKING:
        # HFLoadingMixin
        @property
        def label(self) -> str: ...

        # HFInputsMixin
        def _sid(self, i: int) -> str: ...
        def render(self, prompt: Any, i: int = 0) -> str: ...
        def _images(self, images: Any, i: int) -> List[Image.Image]: ...
        def _check_images(self, text: str, n_images: int, i: int) -> None: ...
        def _check_context(self, length: int, i: int, what: str) -> None: ...
        def _encode(self, texts: List[str], images: List[Image.Image]) -> Dict[str, torch.Tensor]: ...
        def batch_groups(self, images_list: Sequence[Sequence[Any]]) -> List[List[int]]: ...
        def _by_groups(self, groups: List[List[int]], run: Any) -> List[Any]: ...

        # each family (models/interfaces/<family>_interface.py)
        def make_preprocessor(self, config: Dict[str, Any]) -> Any: ...

        # HFProvenanceMixin
        def trace_encoded(self, texts: Sequence[str], enc: Any, images: Sequence[Any] = (),
                          counts: Optional[Sequence[int]] = None) -> None: ...
