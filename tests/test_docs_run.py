"""Every code block of README.md and docs/**/*.md runs as written.

Sybil finds the fenced blocks; ```python blocks run in this process, one namespace per page (a
block may use what an earlier block of its page defined), and ```bash and ```console blocks run
in bash with `set -e` (and `-x`: a failure shows the commands run up to it), the `shardfmt`
command and `python` taken from this interpreter's environment. A console command whose shown
output starts with `Error:` must fail. ```text blocks are output, shown and not run; any other language fails the page, so
a new page cannot slip a block past the suite.

Each page runs in a fresh folder of its own (also its `$HOME`, for `~`), which holds the inputs
the pages name: an ImageFolder under `~/data/imagenet`, a listing, Parquet files as the Hugging
Face Hub ships them, img2dataset-style tars, a `save_to_disk` folder, ... (`workspace`, made once
per session and copied). A page that starts from a dataset converted on another page gets it
converted ahead (`CONVERTED`). `s3://bucket/...` is a bucket on moto's S3 server on 127.0.0.1,
emptied and filled with the pages' remote sources for each page; the AWS variables point there.

A block that cannot run here says so in the Markdown, right above it, with the reason:
``<!-- skip: next "needs a CUDA device" -->`` (Sybil's skip directive, invisible on the site). A
failing block fails its page's test with the page and the block's first line, e.g.
``docs/converting.md:6``.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import SkipTest

import numpy as np
import pytest
import simplejpeg

sybil = pytest.importorskip("sybil")
from sybil import Example, Sybil  # noqa: E402
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser  # noqa: E402

from shardfmt._synthetic import make_image, make_imagefolder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHOWN_ONLY = {"text"}  # output and messages, shown as they read
BIN = Path(sys.executable).parent

# Datasets a page uses without converting them itself, as its reader would have them from an
# earlier page: the path in the page's folder -> the arguments of `shardfmt convert`. `~/data/few`
# is an ImageFolder of 16 images, for pages whose blocks train for 90 epochs.
CONVERTED: dict[str, dict[str, list[str]]] = {
    "docs/loading.md": {"out/train": ["~/data/few"], "out/sr": ["div2k/LR", "div2k/HR", "--scale", "4", "--store", "raw"]},
    "docs/augmentation.md": {"imagenet/train": ["~/data/few"]},
    "docs/batches.md": {"train": ["~/data/few"]},
}


def page_name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# --- the inputs the pages name ----------------------------------------------------------------


def jpeg(height: int, width: int, seed: int) -> bytes:
    return bytes(simplejpeg.encode_jpeg(make_image(height, width, seed=seed), quality=90, colorspace="RGB"))


def png(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def write_tars(folder: Path, names: list[str], per_tar: int, *, captions: bool, labels: bool) -> None:
    """img2dataset's layout (KEY.jpg, KEY.txt, KEY.json) or WebDataset's (KEY.jpg, KEY.cls)."""
    folder.mkdir(parents=True, exist_ok=True)
    number = 0
    for name in names:
        with tarfile.open(folder / name, "w") as tar:
            for _ in range(per_tar):
                key = f"{number:09d}"
                members = {"jpg": jpeg(40, 48, number)}
                if captions:
                    members["txt"] = f"a photo of texture {number}".encode()
                    members["json"] = json.dumps({"url": f"https://example.org/{number}.jpg", "key": key}).encode()
                if labels:
                    members["cls"] = str(number % 4).encode()
                for extension, payload in members.items():
                    info = tarfile.TarInfo(f"{key}.{extension}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
                number += 1


def write_hub_parquet(space: Path) -> None:
    """The Hub's layout, written by `datasets`: images embedded, and images given by path."""
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog"])})
    images = [jpeg(32, 40, 500 + i) for i in range(12)]
    embedded = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in images], "label": [i % 2 for i in range(12)]},
                                          features=features)
    (space / "data").mkdir()
    embedded.select(range(6)).to_parquet(str(space / "data/train-00000-of-00002.parquet"))
    embedded.select(range(6, 12)).to_parquet(str(space / "data/train-00001-of-00002.parquet"))
    embedded.save_to_disk(str(space / "home/hf/cifar10-train"))
    # Dataset.to_parquet() of a dataset made from paths relative to ~/project: bytes null.
    project = space / "home/project"
    (project / "images").mkdir(parents=True)
    for i in range(6):
        (project / f"images/{i}.jpg").write_bytes(images[i])
    by_path = datasets.Dataset.from_dict({"image": [f"images/{i}.jpg" for i in range(6)], "label": [i % 2 for i in range(6)]})
    (space / "hub").mkdir()
    before = Path.cwd()
    os.chdir(project)  # datasets sizes the files by their paths as given
    try:
        by_path.cast(features).to_parquet(str(space / "hub/train.parquet"))
    finally:
        os.chdir(before)


def write_plain_parquet(space: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    for part in range(2):
        rows = range(part * 5, part * 5 + 5)
        table = pa.table({"jpg": [jpeg(32, 40, 700 + i) for i in rows], "id": [f"id-{i:03d}" for i in rows],
                          "label": [i % 2 for i in rows]})
        pq.write_table(table, space / f"part-{part}.parquet")


def write_fields(space: Path) -> None:
    """div2k/LR + div2k/HR (x4, matched by name) and seg.csv (image, mask, label)."""
    for folder in ("div2k/LR", "div2k/HR", "seg"):
        (space / folder).mkdir(parents=True)
    for i in range(6):
        high = make_image(192, 256, seed=900 + i)
        (space / f"div2k/HR/{i:04d}.png").write_bytes(png(high))
        (space / f"div2k/LR/{i:04d}.png").write_bytes(png(np.ascontiguousarray(high[::4, ::4])))
    rows = ["image,mask,label"]
    for i in range(6):
        (space / f"seg/{i}.jpg").write_bytes(jpeg(48, 64, 950 + i))
        (space / f"seg/{i}_mask.png").write_bytes(png((np.arange(48 * 64).reshape(48, 64) % 3).astype(np.uint8)))
        rows.append(f"seg/{i}.jpg,seg/{i}_mask.png,{i % 2}")
    (space / "seg.csv").write_text("\n".join(rows) + "\n")


def write_inputs(space: Path) -> None:
    home = space / "home"
    make_imagefolder(home / "data/imagenet/train", num_classes=4, per_class=32, size=(48, 64), seed=1)
    make_imagefolder(home / "data/imagenet/val", num_classes=4, per_class=4, size=(48, 64), seed=2)
    make_imagefolder(home / "data/few", num_classes=4, per_class=4, size=(48, 64), seed=5)
    make_imagefolder(home / "data/pets/train", num_classes=2, per_class=6, size=(48, 64), seed=3)
    make_imagefolder(space / "src", num_classes=2, per_class=6, size=(300, 320), seed=4)
    shutil.copytree(space / "src", space / "images")
    pictures = sorted((space / "images").rglob("*.JPEG"))
    rows = ["path,label"] + [f"{path.relative_to(space).as_posix()},{path.parent.name}" for path in pictures]
    (space / "listing.csv").write_text("\n".join(rows) + "\n")
    write_hub_parquet(space)
    write_plain_parquet(space)
    write_fields(space)
    write_tars(space / "data/laion-part", ["part-00000.tar", "part-00001.tar"], 6, captions=True, labels=False)
    write_tars(space / "data/wds-train", [f"train-{i:06d}.tar" for i in range(2)], 4, captions=False, labels=True)
    write_tars(space / "data/wds", [f"train-{i:06d}.tar" for i in range(147)], 1, captions=False, labels=True)
    (space / "s3/cifar").mkdir(parents=True)
    write_cifar100_parquet(space / "s3/cifar/train-00000-of-00001.parquet")
    (space / "cat.jpg").write_bytes(jpeg(40, 48, 990))
    (space / "dog.png").write_bytes(png(make_image(40, 48, seed=991)))
    (space / "docs").mkdir()  # where a page writes its pictures, as in a checkout
    for name in ("examples", "tools"):
        (space / name).symlink_to(ROOT / name)


def write_cifar100_parquet(path: Path) -> None:
    """CIFAR-100's columns: the label is `fine_label`, beside a `coarse_label`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = range(8)
    images = [{"bytes": jpeg(32, 32, 800 + i), "path": None} for i in rows]
    pq.write_table(pa.table({"image": images, "fine_label": [i % 4 for i in rows], "coarse_label": [i % 2 for i in rows]}), path)


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """moto's S3 server on 127.0.0.1; the environment that points the AWS clients at it."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from remote_servers import S3_CREDENTIALS, moto_server

    with moto_server() as endpoint:
        yield {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": S3_CREDENTIALS["key"],
               "AWS_SECRET_ACCESS_KEY": S3_CREDENTIALS["secret"], "AWS_DEFAULT_REGION": "us-east-1"}


def fill_buckets(environment: dict[str, str], space: Path) -> None:
    """An empty bucket `bucket`, then the sources the pages read from them."""
    import urllib.request

    import s3fs
    from remote_servers import make_bucket

    endpoint = environment["AWS_ENDPOINT_URL"]
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30).close()
    store = s3fs.S3FileSystem(key=environment["AWS_ACCESS_KEY_ID"], secret=environment["AWS_SECRET_ACCESS_KEY"],
                              endpoint_url=endpoint, client_kwargs={"region_name": "us-east-1"}, skip_instance_cache=True)
    for bucket in ("bucket",):
        make_bucket(endpoint, bucket)
    store.put(str(space / "src"), "bucket/raw/train", recursive=True)
    store.put(str(space / "s3/cifar"), "bucket/cifar", recursive=True)
    store.put(str(space / "s3/laion"), "bucket/laion", recursive=True)


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    space = tmp_path_factory.mktemp("docs-inputs")
    write_inputs(space)
    run_bash("shardfmt convert data/laion-part s3/laion --quiet && shardfmt convert data/laion-part data/cc --quiet",
             cwd=space, home=space / "home")
    return space


# --- running the blocks -----------------------------------------------------------------------


def shell_environment(home: Path) -> dict[str, str]:
    env = {**os.environ, "HOME": str(home), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONSTARTUP", None)
    return env


def run_bash(source: str, *, cwd: Path, home: Path, expect_failure: bool = False) -> None:
    result = subprocess.run(["bash", "-e", "-x", "-o", "pipefail", "-c", source], cwd=cwd, env=shell_environment(home),
                            capture_output=True, text=True, timeout=600)
    if expect_failure:
        if result.returncode == 0:
            raise AssertionError(f"{source.strip()!r} was shown failing but exited 0:\n{result.stdout}{result.stderr}")
    elif result.returncode != 0:
        raise AssertionError(f"exit status {result.returncode}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}")


def console_commands(source: str) -> Iterator[tuple[str, bool]]:
    """The `$ ` lines of a console block, each with whether the output shown under it is an error."""
    lines = source.splitlines()
    for number, line in enumerate(lines):
        if line.startswith("$ "):
            shown = lines[number + 1] if number + 1 < len(lines) else ""
            yield line[2:], shown.startswith("Error:")


def bash_evaluator(example: Example) -> None:
    run_bash(example.parsed, cwd=Path.cwd(), home=Path(os.environ["HOME"]))


def console_evaluator(example: Example) -> None:
    for command, fails in console_commands(example.parsed):
        run_bash(command, cwd=Path.cwd(), home=Path(os.environ["HOME"]), expect_failure=fails)


def unknown_language(example: Example) -> None:
    raise AssertionError(f"a ```{example.region.lexemes.get('arguments')} block: the docs run python, bash and console blocks "
                         f"and show {sorted(SHOWN_ONLY)} blocks; use one of these (tests/test_docs_run.py)")


class OtherLanguages(CodeBlockParser):
    """Every fenced block that no other parser takes: shown-only languages pass, others fail."""

    def __init__(self) -> None:
        super().__init__("any", evaluator=unknown_language)

    def __call__(self, document: Any) -> Iterator[Any]:
        for region in self.lexers(document):
            if region.lexemes["arguments"] not in SHOWN_ONLY | {"python", "bash", "console"}:
                region.parsed = region.lexemes["source"]
                region.evaluator = unknown_language
                yield region


PARSERS = [
    PythonCodeBlockParser(),
    CodeBlockParser("bash", evaluator=bash_evaluator),
    CodeBlockParser("console", evaluator=console_evaluator),
    OtherLanguages(),
    SkipParser(),
]


def convert_ahead(space: Path, page: str) -> None:
    for out, arguments in CONVERTED.get(page, {}).items():
        command = " ".join(["shardfmt", "convert", *arguments, out, "--quiet"])
        run_bash(command, cwd=space, home=space / "home")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", PAGES, ids=page_name)
def test_every_block_runs(path: Path, workspace: Path, object_store: dict[str, str], tmp_path: Path,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    page = page_name(path)
    space = tmp_path / "page"
    shutil.copytree(workspace, space, symlinks=True)
    fill_buckets(object_store, space)
    for name, value in object_store.items():
        monkeypatch.setenv(name, value)
    convert_ahead(space, page)
    monkeypatch.chdir(space)
    monkeypatch.setenv("HOME", str(space / "home"))
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    document = Sybil(PARSERS).parse(path)
    for example in document:
        try:
            example.evaluate()
        except SkipTest:
            continue
        except Exception as error:
            raise AssertionError(f"{page}:{example.line}: this block fails as written: {type(error).__name__}: {error}") from error


def test_every_page_is_collected() -> None:
    names = [page_name(path) for path in PAGES]
    assert "README.md" in names and "docs/converting.md" in names and "docs/migrating/imagefolder.md" in names
    assert set(CONVERTED) <= set(names), "CONVERTED names a page that does not exist"
    for path in PAGES:
        fences = re.findall(r"^ *(```+|~~~+)(.*)$", path.read_text(), flags=re.MULTILINE)
        openings = [info.strip() for info in [info for _, info in fences][::2]]
        assert all(openings), f"{page_name(path)}: a fenced block without a language is neither run nor known as output"


def test_skipped_blocks_say_why() -> None:
    """Each skip directive carries its reason, and there are few of them."""
    directives = [(page_name(path), match.group(1)) for path in PAGES
                  for match in re.finditer(r"<!--\s*skip:\s*(.*?)\s*-->", path.read_text())]
    unexplained = [(page, arguments) for page, arguments in directives if not re.fullmatch(r'next "[^"]{8,}"', arguments)]
    assert not unexplained, f"skip directives need the form: skip: next \"reason\"; found {unexplained}"
