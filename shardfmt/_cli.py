"""The ``shardfmt`` command: a thin click shell over `convert`, `summarise_dataset`,
`verify_dataset`, `preview` and `run_demo`. A user mistake exits with status 1 and one line on stderr."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar

import click

from ._convert.images import DEFAULT_QUALITY, MAX_PIXELS
from ._errors import ConvertError, RemoteError, ShardfmtError
from ._forks import MAX_WORKERS_PER_CORE
from ._version import __version__
from .format._writer import DEFAULT_SHARD_SIZE

__all__ = ["main"]

P = ParamSpec("P")
R = TypeVar("R")
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2, "mib": 1 << 20,
          "g": 1000**3, "gb": 1000**3, "gib": 1 << 30}


if TYPE_CHECKING:
    _IntParamType = click.ParamType[int, Any]  # a generic class in newer click, a plain one in 8.1
else:
    _IntParamType = click.ParamType


class ByteSize(_IntParamType):
    """A byte count such as ``256MiB``, ``1.5GB`` or ``4096``."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _UNITS or float(match.group(1)) * _UNITS[unit] < 1:
            self.fail(f"{value!r} is not a size like 256MiB, 1GB or 4096", param, ctx)
        return int(float(match.group(1)) * _UNITS[unit])


def _reports_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Turn shardfmt and OS errors into one line on stderr and exit status 1; end quietly when
    the reader of stdout has gone (`_end_closed_pipe`)."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except BrokenPipeError:
            _end_closed_pipe()
        except (ShardfmtError, OSError) as err:
            if click.get_current_context().find_root().params.get("debug"):
                raise
            raise click.ClickException(str(err).splitlines()[0] if str(err) else type(err).__name__) from err

    return wrapper


CLOSED_PIPE_STATUS = 128 + getattr(signal, "SIGPIPE", 13)
"""The exit status after stdout's reader went away: the shell's status of a tool SIGPIPE ended."""


def _end_closed_pipe() -> NoReturn:
    """Stdout's reader has gone (``shardfmt info DATASET | head -3``): exit quietly with
    `CLOSED_PIPE_STATUS`, as ``cat`` or ``ls`` would end. Stdout is first pointed at /dev/null,
    as the Python documentation on SIGPIPE advises, so that the interpreter's last flush of what
    is still buffered does not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # stdout is not a file (in a test runner): nothing is left to flush into the pipe
    sys.exit(CLOSED_PIPE_STATUS)


def _on_terminal() -> bool:
    """True if stderr is a terminal, where progress bars go."""
    return sys.stderr.isatty()


def _remote(storage_options: str | None) -> Any:
    from ._storage import RemoteOptions

    return RemoteOptions(storage_options=_parse_storage_options(storage_options))


_STORAGE_OPTIONS_HELP = 'fsspec options for URLs, e.g. \'{"endpoint_url": "http://127.0.0.1:9000"}\'.'


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="shardfmt")
@click.option("--debug", is_flag=True, help="Show the full traceback of an error.")
def main(debug: bool) -> None:
    """Convert image folders into checksummed shards (or WebDataset tars), and inspect them.

    \b
    Examples:
      shardfmt convert ~/data/imagenet/train /fast/imagenet-train
      shardfmt index /data/webdataset-train
      shardfmt info /fast/imagenet-train
      shardfmt verify /fast/imagenet-train
      shardfmt preview /fast/imagenet-train -o grid.png
      shardfmt demo
    """


_CONVERT_HELP = f"""Convert SRC (an ImageFolder tree, a .csv/.jsonl listing, WebDataset tars, Parquet or Arrow
files, or a save_to_disk folder) into a dataset in OUT.

SRC and OUT may be URLs that fsspec opens (s3://bucket/prefix, gs://..., az://...; SRC also
http(s)://). Credentials come from the usual places (environment, ~/.aws, instance roles) or
--storage-options; they never appear in messages. Tars as SRC, and the SRCs of a conversion
with several fields, must be local; OUT may be a URL for every kind of conversion.

Baseline JPEGs are kept byte for byte after a strict decode check; other images are re-encoded;
files that cannot be stored (not an image, corrupt, over {MAX_PIXELS:,} pixels, hidden, ...) are
listed in OUT/rejects.jsonl with a reason. An interrupted run continues with --resume.

Several fields per record: give several folders (one field each, matched by file name), or a
listing with several columns (image,mask,label,weight). --field NAME=KIND names a folder's field
or declares a column's kind: jpeg, raw (RGB pixels), gray, rgba, mask (1 channel of class
values), int64, float64, str, label. --scale states each further image's size relative to the
first (records that differ are rejected). --store raw keeps decoded pixels instead of JPEG.

SRC may be WebDataset tars: a .tar, .tar.gz or .tgz file, a brace pattern
('shards-{{000..099}}.tar') or a folder holding such files and no sub-folders; samples are read
where they lie (compressed tars are first streamed into uncompressed copies in OUT). A sample is
its image (KEY.jpg, .png, ...), its label if the tars have .cls members (none otherwise, as in
img2dataset's KEY.jpg/KEY.txt/KEY.json), and every further member all samples have as a field:
.txt as text, .json as JSON, others as bytes, or as --field NAME=str|json|bytes says; members that
not every sample has are counted in the manifest. --format tar writes WebDataset tars with a
member index each instead of binary shards, the fields as members; webdataset and tar read them,
and so does everything in shardfmt. --format tar takes one SRC and none of --store, --scale or
--patch.

SRC may be Parquet files with the images in a column (the Hugging Face layouts): .parquet files
or a glob pattern ('data/train-*.parquet', or s3://bucket/data/train-*.parquet), .arrow files, or
a folder that datasets' save_to_disk wrote; one record per row. --image-column (binary, or a
struct with 'bytes' or a 'path', resolved against the file's folder or --image-root),
--label-column (integers, named by the files' ClassLabel names if any, or class names; by default
the one ClassLabel column, else 'label'; 'none' for no label) and --key-column pick the columns;
integer columns and no label chosen is an error that lists them. Every other column is kept as a
field (text str, integers int64, floats float64, binary bytes, lists, structs and columns with
nulls json; --field NAME=KIND declares one) unless --drop-column NAME leaves it out. A null or
corrupt image, a missing image file, a null label or a label of -1 is a reject, never fatal.
A run in which every input is rejected exits with status 1 and the counts per reason, after writing everything (--allow-empty accepts it).

\b
Examples:
  shardfmt convert ~/data/imagenet/train /fast/imagenet-train
  shardfmt convert 'data/train-*.parquet' out/train --label-column fine_label
  shardfmt convert train.csv out/ --max-side 512 --quality 90 --workers 8
  shardfmt convert ~/data/pets out/ --resume      # after a crash or Ctrl-C
  shardfmt convert ~/data/pets out/ --overwrite --strict --quiet
  shardfmt convert ~/data/imagenet/train s3://bucket/imagenet-train
  shardfmt convert s3://bucket/raw/train s3://bucket/train --engine ray
  shardfmt convert div2k/LR div2k/HR out/ --scale 4 --store raw
  shardfmt convert LR/ HR/ out/ --field lr --field hr --scale 4 --patch 48
  shardfmt convert seg.csv out/ --field mask=mask      # columns image,mask,label
  shardfmt convert ~/data/pets out/ --store raw --patch 256
  shardfmt convert ~/data/imagenet/train /fast/imagenet-wds --format tar
  shardfmt convert '/data/wds/train-{{000000..000146}}.tar' /fast/train-shards
  shardfmt convert /data/laion-part /fast/laion --field json=bytes   # KEY.jpg, KEY.txt, KEY.json
  shardfmt convert hub/train.parquet out/ --image-root ~/project     # images given by path
  shardfmt convert ~/hf/cifar10-train out/                           # a save_to_disk folder
"""


def _parse_field(value: str) -> tuple[str, str | None]:
    name, _, kind = value.partition("=")
    return name.strip(), (kind.strip() or None)


def _parse_scale(value: str | None) -> Any:
    """'4' -> 4, '2,4' -> [2, 4], 'any' -> None (unchecked); not given -> 1."""
    if value is None:
        return 1
    if value.strip().lower() == "any":
        return None
    try:
        parts = [int(part) for part in value.split(",")]
    except ValueError as err:
        raise click.BadParameter(f"{value!r} is not a whole number, a comma list of them, or 'any'", param_hint="--scale") from err
    return parts[0] if len(parts) == 1 else parts


@main.command("convert", help=_CONVERT_HELP)
@click.argument("sources", metavar="SRC...", nargs=-1, required=True)
@click.argument("out")
@click.option("--shard-size", type=ByteSize(), default=f"{DEFAULT_SHARD_SIZE >> 20}MiB", show_default=True,
              help="Input bytes per shard.")
@click.option("--max-side", type=click.IntRange(min=1), default=None,
              help="Shrink images whose longer side exceeds this many pixels (aspect kept).")
@click.option("--quality", type=click.IntRange(1, 100), default=DEFAULT_QUALITY, show_default=True,
              help="JPEG quality of re-encoded images.")
@click.option("--workers", type=click.IntRange(min=1, max=MAX_WORKERS_PER_CORE * (os.cpu_count() or 1)), default=None,
              help=f"Processes converting shards in parallel (at most {MAX_WORKERS_PER_CORE} per core); 1 runs in this process. "
                   "[default: one per CPU]")
@click.option("--resume", is_flag=True, help="Finish an interrupted conversion into OUT (same inputs and options).")
@click.option("--overwrite", is_flag=True, help="Remove shardfmt's files from OUT first (nothing else is touched).")
@click.option("--strict", is_flag=True, help="Exit with status 1 if any input was rejected (after writing everything).")
@click.option("--store", type=click.Choice(["jpeg", "raw", "gray", "rgba", "mask"]), default="jpeg", show_default=True,
              help="How images are stored: JPEG, or decoded pixels (raw: RGB) that load without a decode.")
@click.option("--field", "fields", multiple=True, metavar="NAME[=KIND]",
              help="Name a folder's field (in order), declare a listing or Parquet column's kind, or a tar member's "
                   "(str, json, bytes: samples without it are rejected). Repeatable.")
@click.option("--scale", default=None, metavar="S|S1,S2|any",
              help="Size of each further image field relative to the first, checked per record. [default: 1]")
@click.option("--patch", type=click.IntRange(min=1), default=None,
              help="Resize so the shorter side is N and keep the centered N x N square (further fields: N x scale).")
@click.option("--format", "shard_format", type=click.Choice(["binary", "tar"]), default="binary", show_default=True,
              help="Shard format: shardfmt's binary shards, or WebDataset tars with a member index each.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary.")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: a process pool here; ray: one task per shard on the running Ray cluster (or a local one).")
@click.option("--storage-options", "storage_options", default=None, metavar="JSON",
              help='fsspec options for URLs, e.g. \'{"endpoint_url": "http://127.0.0.1:9000"}\'.')
@click.option("--allow-empty", is_flag=True,
              help="Write an empty dataset when SRC holds no image, or every input was rejected, instead of failing.")
@click.option("--break-lock", is_flag=True,
              help="Remove the lock object a crashed run left in an OUT given by URL (a local lock needs no breaking).")
@click.option("--image-column", default=None, metavar="NAME",
              help="Parquet: the image column, binary or a struct with 'bytes'. [default: image]")
@click.option("--label-column", default=None, metavar="NAME|none",
              help="Parquet/Arrow: the label column, integers or class names; none: no label. "
                   "[default: the one ClassLabel column, else label]")
@click.option("--drop-column", "drop_columns", multiple=True, metavar="NAME",
              help="Parquet/Arrow: leave this column out (every other one is kept as a field). Repeatable.")
@click.option("--key-column", default=None, metavar="NAME",
              help="Parquet: a column of record keys. [default: the file name and row number]")
@click.option("--image-root", default=None, metavar="DIR",
              help="Parquet/Arrow/listings: the folder image paths (relative or absolute) are resolved against and must stay "
                   "inside. [default: each file's folder, or the listing's]")
@_reports_errors
def convert_command(sources: tuple[str, ...], out: str, shard_size: int, max_side: int | None, quality: int,
                    workers: int | None, resume: bool, overwrite: bool, strict: bool, store: str,
                    fields: tuple[str, ...], scale: str | None, patch: int | None, shard_format: str, quiet: bool,
                    engine: str, storage_options: str | None, allow_empty: bool, break_lock: bool,
                    image_column: str | None, label_column: str | None, key_column: str | None, image_root: str | None,
                    drop_columns: tuple[str, ...]) -> None:
    from ._convert.api import convert
    from ._convert.destination import cli_wording

    try:
        summary = convert(
            list(sources), out, fields=[_parse_field(value) for value in fields], store=store, scale=_parse_scale(scale), patch=patch,
            shard_format=shard_format, image_column=image_column, label_column=label_column, key_column=key_column,
            image_root=image_root, drop_columns=drop_columns, shard_size=shard_size, max_side=max_side, quality=quality,
            workers=workers, resume=resume, overwrite=overwrite, strict=strict, progress=not quiet and sys.stderr.isatty(), engine=engine,
            remote=_remote(storage_options), allow_empty=allow_empty, break_lock=break_lock,
        )
    except RemoteError as err:  # the store stopped the run: say how to resume with this command's flags
        raise RemoteError(cli_wording(err.message), path=err.path, transient=err.transient) from err
    except ConvertError as err:  # raised from Python, the message names keywords: say this command's flags
        raise type(err)(cli_wording(err.message), path=err.path, offset=err.offset, record=err.record) from err
    result = summary.result
    if result.already_finished:
        if not quiet:
            click.echo(f"nothing to resume: {result.path} holds a finished dataset ({result.num_records:,} records in "
                       f"{len(result.manifest.shards)} shards), left as it was")
    elif not quiet:
        kept = f", {result.reused_shards} finished shards kept" if result.reused_shards else ""
        click.echo(f"{result.num_records:,} records in {len(result.manifest.shards)} shards, {result.num_rejects:,} "
                   f"rejected, in {result.seconds:.1f} s ({result.images_per_second:,.0f} images/s, "
                   f"{result.input_bytes / max(result.seconds, 1e-9) / 1e6:,.1f} MB/s){kept}: {result.path}")
        _echo_not_stored(result.manifest.stats)


def _echo_not_stored(stats: dict[str, Any]) -> None:
    """Say what of the source a conversion did not store: members of tars, dropped columns."""
    not_stored = stats.get("members_not_stored") or {}
    if not_stored:
        click.echo("members not stored (not in every sample; --field NAME=KIND keeps one): "
                   + ", ".join(f".{ext}: {n:,}" for ext, n in sorted(not_stored.items())))
    for line in _column_lines(stats):
        click.echo(f"{line[0]}: {line[1]}")


def _column_lines(stats: dict[str, Any]) -> list[tuple[str, str]]:
    """The further columns of a Parquet or Arrow source that were kept as fields and dropped."""
    if "columns_kept" not in stats:
        return []
    return [("columns kept", ", ".join(stats["columns_kept"]) or "none"),
            ("columns dropped", ", ".join(stats.get("columns_dropped") or []) or "none")]


def _parse_storage_options(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise click.BadParameter(f"not JSON: {err.msg}", param_hint="--storage-options") from None
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--storage-options")
    return value


@main.command("index")
@click.argument("sources", nargs=-1, required=True)
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="The dataset folder; it must contain every tar. [default: the tars' deepest common folder]")
@click.option("--overwrite", is_flag=True, help="Replace the manifest already in the dataset folder.")
@click.option("--field", "fields", multiple=True, metavar="NAME=KIND",
              help="Store member NAME (an extension) as KIND: str, json or bytes. Repeatable.")
@click.option("--quiet", "-q", is_flag=True, help="No summary.")
@_reports_errors
def index_command(sources: tuple[str, ...], out: Path | None, overwrite: bool, fields: tuple[str, ...], quiet: bool) -> None:
    """Make existing WebDataset tars a dataset, in place: index every tar and write a manifest.

    SOURCES are .tar files, brace patterns ('shards-{000..099}.tar') or folders (every .tar below,
    sorted). Each tar gets its member index (NAME.tar.idx) and is read where it lies. A sample is
    its JPEG (KEY.jpg), its label if the tars have .cls members (classes are the labels in
    decimal; without .cls the dataset has no labels), and every further member that all samples
    have as a field: .txt as text, .json as JSON, anything else as bytes (or as --field says).
    Samples without a usable JPEG (or label, where there are labels) are listed in rejects.jsonl
    with a reason; members that not every sample has stay in the tars and are counted. Compressed
    tars (.tar.gz, .tgz) cannot be read in place: convert them (shardfmt convert) or decompress them.

    \b
    Examples:
      shardfmt index /data/wds-train
      shardfmt index /data/laion-part --field json=bytes
      shardfmt index '/data/wds/train-{000000..000146}.tar' --out /data/wds
    """
    from ._dataset.tars import index_tars

    declared = dict(_parse_field(value) for value in fields)
    manifest = index_tars(sources, out=out, overwrite=overwrite, fields={k: v for k, v in declared.items() if v is not None})
    if not quiet:
        rejected = manifest.rejects.get("count", 0)
        by_reason = manifest.rejects.get("by_reason") or {}
        reasons = ", ".join(f"{count:,} {reason}" for reason, count in sorted(by_reason.items()))
        click.echo(f"{manifest.num_records:,} records in {len(manifest.shards)} tars, {rejected:,} samples rejected"
                   f"{f' ({reasons}; see rejects.jsonl)' if rejected else ''}")
        click.echo(f"fields: {', '.join(f'{f.name} ({f.spec})' for f in manifest.schema.fields)}")
        not_stored = manifest.stats.get("members_not_stored") or {}
        if not_stored:
            click.echo("members not stored (not in every sample): " + ", ".join(f".{ext}: {n:,}" for ext, n in not_stored.items()))


@main.command("info")
@click.argument("dataset")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--storage-options", "storage_options", default=None, metavar="JSON", help=_STORAGE_OPTIONS_HELP)
@_reports_errors
def info_command(dataset: str, as_json: bool, storage_options: str | None) -> None:
    """Show what DATASET holds: records, classes, shards, bytes, image sizes, rejects.

    Reads the manifest and the record tables only. DATASET may be a URL (s3://bucket/prefix, ...):
    one GET for the manifest and two range reads per shard.

    \b
    Examples:
      shardfmt info /fast/imagenet-train
      shardfmt info /fast/imagenet-train --json | jq .height
      shardfmt info s3://bucket/imagenet-train
    """
    from ._dataset.summary import summarise_dataset

    summary = summarise_dataset(dataset, remote=_remote(storage_options))
    if as_json:
        click.echo(json.dumps(asdict(summary), default=str, indent=2, sort_keys=True))
        return

    def spread(value: tuple[int, float, int] | None) -> str:
        return "-" if value is None else f"min {value[0]}, median {value[1]:g}, max {value[2]}"

    labelled = any(name == "label" for name, _ in summary.fields)
    classes = ("none (integer labels)" if labelled else "none (no labels)") if summary.classes is None else f"{len(summary.classes):,}"
    empty = summary.stats.get("empty_classes")
    lines = [
        ("dataset", str(summary.path)),
        ("records", f"{summary.num_records:,}"),
        ("classes", classes + (f" ({empty} without records)" if empty else "")),
        ("per class", spread(summary.records_per_class)),
        ("shards", f"{summary.num_shards:,}"),
        ("bytes", f"{summary.num_bytes:,} ({summary.num_bytes / 2**20:,.1f} MiB)"),
        ("height", spread(summary.height)),
        ("width", spread(summary.width)),
        ("channels", ", ".join(f"{c}: {n:,}" for c, n in sorted(summary.channels.items())) or "-"),
        ("rejects", ", ".join(f"{r}: {n:,}" for r, n in sorted(summary.rejects.items())) or "none"),
    ]
    lines.insert(1, ("fields", ", ".join(f"{name} ({kind})" for name, kind in summary.fields)))
    not_stored = summary.stats.get("members_not_stored")
    if isinstance(not_stored, dict) and not_stored:
        lines.append(
            ("not stored", ", ".join(f".{ext}: {n:,}" for ext, n in sorted(not_stored.items())) + " (members not in every sample)")
        )
    lines.extend(_column_lines(summary.stats))
    reencoded = summary.stats.get("reencoded")
    if isinstance(reencoded, dict):
        done = ", ".join(f"{r}: {n:,}" for r, n in sorted(reencoded.items()) if n)
        lines.append(("re-encoded", done or "none"))
        lines.append(("passed through", f"{summary.stats.get('passthrough', 0):,}"))
    for label, value in lines:
        click.echo(f"{label:<15} {value}")


@main.command("verify")
@click.argument("dataset")
@click.option("--quick", is_flag=True, help="Check the manifest and record tables only; hash no payload.")
@click.option("--storage-options", "storage_options", default=None, metavar="JSON", help=_STORAGE_OPTIONS_HELP)
@_reports_errors
def verify_command(dataset: str, quick: bool, storage_options: str | None) -> None:
    """Check DATASET: structure, record checksums and whole-file checksums.

    Exits with status 1 and one line per bad shard (file, byte offset, record) on any problem.
    DATASET may be a URL (s3://bucket/prefix, ...); a full check fetches each shard once. On a
    terminal, a dataset of 1 GiB or more shows a progress bar.

    \b
    Examples:
      shardfmt verify /fast/imagenet-train
      shardfmt verify /fast/imagenet-train --quick   # seconds, even for large datasets
      shardfmt verify s3://bucket/imagenet-train
    """
    from ._dataset.verify import verify_dataset

    report = verify_dataset(dataset, quick=quick, remote=_remote(storage_options), progress=_on_terminal())
    for problem in report.problems:
        click.echo(f"error: {problem}", err=True)
    what = "manifest and record tables" if quick else f"structure and checksums, {report.bytes_hashed:,} bytes hashed"
    if not report.ok:
        raise click.ClickException(f"{len(report.problems)} problem(s) in {report.path} ({what})")
    click.echo(f"ok: {report.num_shards:,} shards, {report.num_records:,} records ({what})")


def _parse_augment(values: tuple[str, ...]) -> dict[str, Any]:
    """'scale=0.25,1' -> {"scale": (0.25, 1.0)}, 'flip=0' -> {"flip": 0.0}."""
    found: dict[str, Any] = {}
    for value in values:
        name, _, text = value.partition("=")
        try:
            numbers = tuple(float(part) for part in text.split(","))
        except ValueError:
            numbers = ()
        if name.strip() not in ("scale", "ratio", "flip") or len(numbers) != (1 if name.strip() == "flip" else 2):
            raise click.BadParameter(f"{value!r} is none of scale=LOW,HIGH, ratio=LOW,HIGH, flip=P", param_hint="--augment")
        found[name.strip()] = numbers[0] if len(numbers) == 1 else numbers
    return found


def _parse_records(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma list of record indices", param_hint="--records") from None


@main.command("preview")
@click.argument("dataset")
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="The PNG to write.")
@click.option("--pipeline", type=click.Choice(["train", "eval", "resize"]), default="train", show_default=True,
              help="The Loader's pipeline: train (RandomResizedCrop + flip), eval (center crop) or resize.")
@click.option("--augment", multiple=True, metavar="NAME=VALUE",
              help="The train pipeline's RandomResizedCrop, as the Loader's: scale=LOW,HIGH ratio=LOW,HIGH flip=P. Repeatable.")
@click.option(
    "--seed", type=click.IntRange(0, 2**64 - 1), default=0, show_default=True, help="The Loader's seed: which records, which crops."
)
@click.option("--size", type=click.IntRange(8, 1024), default=160, show_default=True, help="Pipeline output and tile side, in pixels.")
@click.option("--rows", type=click.IntRange(1, 64), default=4, show_default=True, help="Rows of tiles.")
@click.option("--cols", type=click.IntRange(1, 64), default=8, show_default=True, help="Columns of tiles.")
@click.option("--records", default=None, metavar="I,J,...", help="Show these records as stored, instead of a loader batch.")
@click.option("--storage-options", "storage_options", default=None, metavar="JSON", help=_STORAGE_OPTIONS_HELP)
@_reports_errors
def preview_command(dataset: str, output: Path, pipeline: str, augment: tuple[str, ...], seed: int, size: int, rows: int, cols: int,
                    records: str | None, storage_options: str | None) -> None:
    """Draw a contact sheet of one batch of DATASET as the Loader yields it, into a PNG.

    Each tile is labelled with its class name and record index. The batch is the first of epoch
    0 for --seed: the crops, flips and colours training sees. With --records, the stored images
    are shown as they are (shrunk to fit a tile, never enlarged).

    \b
    Examples:
      shardfmt preview /fast/imagenet-train -o grid.png
      shardfmt preview /fast/imagenet-train -o grid.png --augment scale=0.25,1 --augment flip=0 --seed 3
      shardfmt preview /fast/imagenet-val -o val.png --pipeline eval --rows 2 --cols 6
      shardfmt preview /fast/imagenet-train -o stored.png --records 0,17,42
    """
    from ._preview import preview

    indices = _parse_records(records)
    try:
        sheet = preview(dataset, output, rows=rows, cols=cols, pipeline=pipeline, size=size, seed=seed,
                        augment=_parse_augment(augment), records=indices, remote=_remote(storage_options))
    except (ValueError, IndexError) as err:
        raise click.ClickException(str(err)) from err
    width, height = sheet.layout.size
    what = "stored records" if indices is not None else f"records of the first {pipeline} batch (seed {seed})"
    click.echo(f"{len(sheet.tiles)} {what} in {width}x{height} px: {sheet.path}")


@main.command("demo")
@click.option("--dir", "directory", type=click.Path(path_type=Path), default=None,
              help="Keep the generated folder and dataset here. [default: a temporary folder, removed after]")
@click.option("--images", type=click.IntRange(min=1), default=500, show_default=True, help="JPEGs to generate.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Conversion processes. [default: one per CPU]")
@_reports_errors
def demo_command(directory: Path | None, images: int, workers: int | None) -> None:
    """Generate a small ImageFolder, convert it, read it back, and show how fast each step was.

    \b
    Examples:
      shardfmt demo
      shardfmt demo --dir /tmp/shardfmt-demo --images 2000
    """
    from ._demo import run_demo

    if directory is None:
        with tempfile.TemporaryDirectory(prefix="shardfmt-demo-") as temp:
            _print_demo(run_demo(temp, images=images, workers=workers), kept=False)
    else:
        _print_demo(run_demo(directory, images=images, workers=workers), kept=True)


def _print_demo(result: Any, *, kept: bool) -> None:
    converted = result.converted
    click.echo(f"generated  {converted.num_inputs:,} JPEGs ({converted.input_bytes / 1e6:,.1f} MB) in "
               f"{result.generate_seconds:.1f} s: {result.source}")
    click.echo(f"converted  {converted.num_records:,} records into {len(converted.manifest.shards)} shards in "
               f"{converted.seconds:.2f} s ({converted.images_per_second:,.0f} images/s): {result.output}")
    click.echo(f"read       {result.read_images:,} records, checksums verified and decoded to RGB, in "
               f"{result.read_seconds:.2f} s ({result.read_images / max(result.read_seconds, 1e-9):,.0f} images/s)")
    if result.loader_skipped is not None:
        click.echo(f"loader     skipped: {result.loader_skipped}")
    else:
        click.echo(f"loader     {result.loader_images:,} images in {result.loader_seconds:.2f} s "
                   f"({result.loader_images / max(result.loader_seconds, 1e-9):,.0f} images/s)")
    if not kept:
        click.echo("(the temporary folder is removed; pass --dir to keep it)")
