"""The one form of a batch inside the loader (`BatchForm`): a dict of fields, rendered at the end
as the dict, as (images, labels[, indices]) or as the images alone; and what serves the
(images, labels) form only, refused with ``fields=`` for one reason, stated once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import jpeg_bytes

from shardfmt import DatasetWriter, ImageTransform, Loader, Output
from shardfmt._loader.form import SINGLE_FORM_ONLY, BatchForm
from shardfmt._loader.outputs import OutputSpec
from shardfmt.format import Schema
from shardfmt.ops import MixUp

SIXTEEN = ImageTransform(size=16)

IMAGE = OutputSpec("image", "jpeg", (4, 4, 3), "|u1")
LABEL = OutputSpec("label", "int64", (), "<i8")
ZEROS = OutputSpec(".labels", "zeros", (), "<i8")
INDEX = OutputSpec(".index", "index", (), "<i8")


def batch_of(*specs: OutputSpec) -> dict[str, torch.Tensor]:
    return {spec.name: torch.full((2,), number) for number, spec in enumerate(specs)}


@pytest.mark.parametrize(
    ("specs", "label", "index", "rendered"),
    [
        ((IMAGE, LABEL), "label", None, [0, 1]),
        ((IMAGE, LABEL, INDEX), "label", ".index", [0, 1, 2]),
        ((IMAGE, ZEROS, INDEX), ".labels", ".index", [0, 1, 2]),
        ((IMAGE, INDEX), None, ".index", [0, 1]),  # a dataset without labels, with its indices
        ((IMAGE,), None, None, 0),  # a dataset without labels: the images alone
    ],
)
def test_the_tuple_form_is_a_rendering_of_the_dict(
    specs: tuple[OutputSpec, ...], label: str | None, index: str | None, rendered: object
) -> None:
    form = BatchForm.of(specs, fields=False)
    assert (form.image, form.label, form.index) == ("image", label, index)
    out = form.render(batch_of(*specs))
    if isinstance(rendered, int):
        assert isinstance(out, torch.Tensor) and out.tolist() == [rendered] * 2
    else:
        assert [t.tolist() for t in out] == [[number] * 2 for number in rendered]


def test_the_dict_form_is_handed_out_as_it_is() -> None:
    batch = batch_of(IMAGE, LABEL, INDEX) | {"caption": ["a", "b"]}
    form = BatchForm.of((IMAGE, LABEL, INDEX), fields=True, normalised="image")
    assert form.render(batch) is batch
    assert (form.image, form.label, form.normalised) == (None, None, "image")


@pytest.fixture(scope="module")
def unlabelled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("unlabelled") / "ds"
    with DatasetWriter(out, schema=Schema.of(image="jpeg"), shard_size=20_000) as writer:
        for i in range(8):
            writer.write({"image": jpeg_bytes(20, 24, seed=i)})
    return out


def test_what_serves_the_single_form_only_is_refused_with_fields_for_one_reason(small_dataset_module: Path) -> None:
    fields = {"image": 16, "label": None}
    errors = []
    with pytest.raises(ValueError) as caught:
        Loader(small_dataset_module, batch_size=4, num_workers=0, fields=fields, batch_augment=[MixUp(num_classes=3)])
    errors.append(caught.value)
    with pytest.raises(ValueError) as caught:
        Loader(small_dataset_module, batch_size=4, num_workers=0, fields=fields, transform=ImageTransform(decode="gpu"))
    errors.append(caught.value)
    with Loader(small_dataset_module, batch_size=4, num_workers=0, fields=fields) as loader, pytest.raises(ValueError) as caught:
        loader.set_size(20)
    errors.append(caught.value)
    heads = [str(error).split(" serves the (images, labels) form only: ")[0] for error in errors]
    assert heads == list(SINGLE_FORM_ONLY)
    reasons = {str(error).split(" serves the (images, labels) form only: ")[1].split("; with fields=..., ")[0] for error in errors}
    assert len(reasons) == 1
    assert [str(error).split("; with fields=..., ")[1] for error in errors] == list(SINGLE_FORM_ONLY.values())


def test_an_unknown_decode_mode_is_named_as_such_with_fields(small_dataset_module: Path) -> None:
    with pytest.raises(ValueError, match="decode must be one of 'cpu', 'gpu', 'hybrid', got 'tpu'"):
        Loader(small_dataset_module, batch_size=4, num_workers=0, fields=["image"], transform=ImageTransform(decode="tpu"))


def test_batch_steps_over_a_dataset_without_labels_are_refused_when_the_loader_is_made(unlabelled: Path) -> None:
    with Loader(unlabelled, batch_size=4, num_workers=0, transform=SIXTEEN) as loader:
        assert next(iter(loader)).shape == (4, 3, 16, 16)  # the images alone
    with pytest.raises(ValueError, match=r"batch_augment mixes the labels, but this dataset has none; give Output\(label_field=None\)"):
        Loader(unlabelled, batch_size=4, num_workers=0, transform=SIXTEEN, batch_augment=[MixUp(num_classes=3)])
    mix_zero_labels: dict[str, Any] = {"output": Output(label_field=None), "batch_augment": [MixUp(num_classes=3)]}
    with Loader(unlabelled, batch_size=4, num_workers=0, transform=SIXTEEN, **mix_zero_labels) as loader:
        images, soft = next(iter(loader))
        assert images.dtype == torch.float32 and soft.tolist() == [[1.0, 0.0, 0.0]] * 4  # zero labels, mixed with zero labels
