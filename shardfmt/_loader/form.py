"""The one form of a batch inside the loader, and how it reaches the caller.

Inside the loader a batch is a dict of fields, one entry an output (`outputs.OutputSpec.name`,
in the outputs' order) and one a field read as lists (`values`): the slot's tensors as
`scheduler.Scheduler.hand_out` makes them, on the device after `cuda.DeviceStage.transfer`,
through the batch steps. `BatchForm.render` turns it into what the caller asked for at the very
end: the dict itself with ``fields=...``; else ``(images, labels[, indices])``, or the images
alone for a dataset without labels.

What serves only the (images, labels) form is said here, once (`SINGLE_FORM_ONLY`,
`refuse_with_fields`): normalisation, augment steps and the index work with `fields=` too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .outputs import OutputSpec

__all__ = ["SINGLE_FORM_ONLY", "BatchForm", "check_fields_form", "refuse_with_fields"]

SINGLE_FORM_ONLY = {
    "batch_augment": "mix the batches yourself (shardfmt.ops.apply_batch_steps on the entries you choose)",
    "decode='gpu'/'hybrid'": "use decode='cpu'",
    "set_size": "make a loader for the new sizes",
}
"""What serves the (images, labels) form only, each with what to do instead with ``fields=...``."""

_REASON = (
    "it acts on the one image field, at the one size of the pipeline, and its labels, where a batch of fields=... holds any number "
    "of image fields, each at a size of its own, and no field that must be the labels"
)


def refuse_with_fields(option: str) -> ValueError:
    """The error that refuses `option` (a key of `SINGLE_FORM_ONLY`) with ``fields=...``."""
    return ValueError(f"{option} serves the (images, labels) form only: {_REASON}; with fields=..., {SINGLE_FORM_ONLY[option]}")


def check_fields_form(*, fields: bool, batch_augment: bool, decode: str) -> None:
    """Refuse, with ``fields=...`` (`fields`), the options that serve the (images, labels) form only.

    Raises:
        ValueError: `refuse_with_fields`.
    """
    if not fields:
        return
    if batch_augment:
        raise refuse_with_fields("batch_augment")
    if decode in ("gpu", "hybrid"):
        raise refuse_with_fields("decode='gpu'/'hybrid'")


@dataclass(frozen=True)
class BatchForm:
    """How a loader's batch, a dict of fields inside, is handed out.

    `fields`: the caller asked for ``fields=...`` and gets the dict; else `image`, `label`
    (None for a dataset without labels) and `index` (None without ``return_indices``) name the
    entries of the tuple, in that order. `normalised`: the image field that ``mean``/``std``
    normalise, or None.
    """

    fields: bool
    image: str | None = None
    label: str | None = None
    index: str | None = None
    normalised: str | None = None

    @classmethod
    def of(cls, outputs: Sequence[OutputSpec], *, fields: bool, normalised: str | None = None) -> BatchForm:
        """The form of a loader delivering `outputs` (as `outputs.resolve_outputs` and the index
        make them): without `fields`, its first output is the image, an "index" output the
        index, and any other the labels."""
        if fields:
            return cls(True, normalised=normalised)
        label = next((spec.name for spec in outputs[1:] if spec.type != "index"), None)
        index = next((spec.name for spec in outputs if spec.type == "index"), None)
        return cls(False, outputs[0].name, label, index, normalised)

    def render(self, batch: dict[str, Any]) -> Any:
        """`batch` as the caller receives it: the dict with `fields`; else (images, labels[,
        indices]), or the images alone (with their indices) where there are no labels."""
        if self.fields:
            return batch
        entries = [name for name in (self.image, self.label, self.index) if name is not None]
        if len(entries) == 1:
            return batch[entries[0]]
        return tuple(batch[name] for name in entries)
