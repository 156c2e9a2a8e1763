"""The one conversion loop: a plan becomes shards, sidecars, rejects.jsonl and the manifest.

Every source, output, engine and set of record fields goes through `run_conversion`:

1. The plan is stored in the output (or checked against the stored one when resuming).
2. Shards that a previous run finished (their sidecar agrees with their files) are kept.
3. The records of the other shards are cut into chunks of a few records (rows of a Parquet file:
   the rows of one row group, read at once) and built by the engine's workers
   (`records.build_chunk`: read, check, normalise), all workers on all chunks, so one shard is
   built on every core and the last shard is no straggler. Worker processes leave the chunk's
   bytes in memory this process shares (`CHUNK_BYTES` a chunk in flight), not in a pipe.
4. This process takes the built records back in plan order and writes each shard in order
   (`ShardWriter`, or `TarShardWriter` for tar shards, which also refuses keys that repeat in
   the shard or labels a ``.cls`` member cannot hold), commits it, then writes its sidecar.
5. rejects.jsonl, then manifest.json, the commit point; then the work folder goes.

The bytes of every shard depend only on the plan, never on the number of workers or the engine.
A conversion killed at any moment is finished by running it again with ``resume``.
"""

from __future__ import annotations

import errno
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tqdm import tqdm

from .._checksum import format_checksum, parse_checksum
from .._errors import ConvertError, RemoteError, SchemaError, WorkerError
from .._storage.remote import forks_safely
from .._storage.urls import is_url, join_url
from .._version import __version__
from ..format._layout import MAX_CLASSES
from ..format._manifest import IndexEntry, Manifest, ShardEntry
from ..format._writer import ShardWriter
from ..tar._keys import display_key, tar_key
from ..tar._writer import TarShardInfo, TarShardWriter, encode_member
from .destination import REJECTS_NAME, Output, shard_file_name
from .engine import WorkerDied, imap_ordered
from .images import REENCODE_REASONS
from .plan import ConversionPlan, PlannedRecord, compare_plans
from .records import Built, Chunk, RecordBuilder, build_chunk, unplace
from .sources.results import display_path

__all__ = ["CHUNK_BYTES", "CHUNK_RECORDS", "ConvertResult", "run_conversion"]

CHUNK_RECORDS: Final = 16
"""Records in one unit of parallel work, at most."""
CHUNK_BYTES: Final = 8 << 20
"""Input bytes in one unit of parallel work, at most (a larger record makes a chunk alone)."""
_WINDOW_PER_WORKER: Final = 4


@dataclass(frozen=True)
class ConvertResult:
    """What a conversion did.

    Attributes:
        path: the output folder (or URL, without credentials).
        manifest: the manifest written there.
        num_inputs: candidate files found (rejects found while scanning are not among them).
        num_records: records written.
        num_rejects: lines in rejects.jsonl.
        input_bytes: total size of the candidate files.
        reused_shards: shards a previous, interrupted run had finished and this one kept.
        seconds: wall time of the whole call.
        already_finished: asked to resume, the output held a finished dataset, left as it was
            (`num_inputs` and `input_bytes` are then 0: nothing was read).
    """

    path: Path | str
    manifest: Manifest
    num_inputs: int
    num_records: int
    num_rejects: int
    input_bytes: int
    reused_shards: int
    seconds: float
    already_finished: bool = False

    @property
    def images_per_second(self) -> float:
        return self.num_inputs / self.seconds if self.seconds > 0 else 0.0


def already_finished(output: Output, *, started: float) -> ConvertResult:
    """The result of resuming into an output that holds a finished dataset: nothing done."""
    manifest = output.finished
    if manifest is None:
        raise ValueError("the output holds no finished dataset")
    rejects = output.store.get(REJECTS_NAME) if output.store.exists(REJECTS_NAME) else b""
    return ConvertResult(
        path=output.location,
        manifest=manifest,
        num_inputs=0,
        num_records=manifest.num_records,
        num_rejects=len(rejects.splitlines()),
        input_bytes=0,
        reused_shards=len(manifest.shards),
        seconds=time.perf_counter() - started,
        already_finished=True,
    )


def run_conversion(
    plan: ConversionPlan,
    output: Output,
    *,
    builder: RecordBuilder,
    workers: int,
    engine: str,
    progress: bool,
    strict: bool,
    started: float,
) -> ConvertResult:
    """Carry out `plan` into `output` (see the module docstring).

    Raises:
        ConvertError: the inputs or options changed since an interrupted run; or `strict` and an
            input was rejected (after everything is written).
        RemoteError: a store did not answer within its retries: the run stops there, the shards
            finished so far kept, no input rejected for it, the manifest not written.
        WorkerError: a failure other than a bad input, naming the shard and the input; or a
            worker process died.
    """
    if output.has_plan:
        compare_plans(output.read_plan(), plan, where=output.location)
    else:
        output.write_plan(plan.to_bytes())
    sidecars: list[dict[str, Any] | None] = [None] * len(plan.shards)
    with tqdm(total=len(plan.records), unit="img", desc="convert", disable=not progress, smoothing=0.1) as bar:
        for index, (start, stop) in enumerate(plan.shards):
            sidecars[index] = output.finished_sidecar(index, num_records=stop - start, shard_format=plan.shard_format)
            if sidecars[index] is not None:
                bar.update(stop - start)
        reused = sum(s is not None for s in sidecars)
        todo = [index for index, sidecar in enumerate(sidecars) if sidecar is None]
        per_shard = {index: list(_chunks(plan, index)) for index in todo}
        chunks = [chunk for index in todo for chunk in per_shard[index]]
        window = max(1, workers) * _WINDOW_PER_WORKER
        fork = forks_safely(plan.root)
        results = imap_ordered(build_chunk, builder, chunks, engine=engine, workers=workers, window=window, scratch=CHUNK_BYTES, fork=fork)
        try:
            for index in todo:
                sidecars[index] = _write_shard(plan, output, index, per_shard[index], results, bar)
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise disk_full_error(output) from err
            raise
        finally:
            results.close()
            output.drop_staging()
    done = [s for s in sidecars if s is not None]
    manifest, rejects, report = build_outputs(plan, done)
    try:
        output.finish(manifest, report)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise disk_full_error(output) from err
        raise
    if strict and rejects:
        first = rejects[0]
        where = join_url(plan.root, first["path"]) if is_url(plan.root) else Path(plan.root) / first["path"]
        raise ConvertError(
            (
                f"{first['reason']}: {first['detail']} (the first of {len(rejects)} rejects; strict=True; all are in "
                f"{output.describe(REJECTS_NAME)})"
            ),
            path=where,
        )
    return ConvertResult(
        path=output.location,
        manifest=manifest,
        num_inputs=len(plan.records),
        num_records=manifest.num_records,
        num_rejects=len(rejects),
        input_bytes=plan.input_bytes,
        reused_shards=reused,
        seconds=time.perf_counter() - started,
    )


def _chunks(plan: ConversionPlan, index: int) -> Iterator[Chunk]:
    """The records of shard `index` in chunks of at most CHUNK_RECORDS records and CHUNK_BYTES;
    rows of a Parquet file in chunks of one row group each, which a worker reads at once."""
    start, stop = plan.shards[index]
    batch: list[tuple[int, PlannedRecord]] = []
    size = 0
    group: tuple[str, int] | None = None
    for number in range(start, stop):
        record = plan.records[number]
        file = record.files[0]
        this = (file.path, file.row_group) if file.row_group is not None else None
        full = this is None and (len(batch) >= CHUNK_RECORDS or size + record.size > CHUNK_BYTES)
        if batch and (full or this != group):
            yield Chunk(index, tuple(batch))
            batch, size = [], 0
        group = this
        batch.append((number, record))
        size += record.size
    if batch:
        yield Chunk(index, tuple(batch))


class _Sink:
    """Shard `index` being written, in record order; tar shards also refuse a key that repeats in
    the shard ("duplicate-key") and a label a ``.cls`` member cannot hold ("bad-label")."""

    def __init__(self, plan: ConversionPlan, output: Output, index: int) -> None:
        self.plan, self.output, self.index = plan, output, index
        self.name = shard_file_name(index, plan.shard_format)
        self.tar = plan.shard_format == "tar"
        self.label_index = plan.label_index
        self.labelled = self.label_index is not None
        self.writer: Any = None
        self.keys: set[str] = set()
        self.rejects: list[list[Any]] = []
        self.passthrough = 0
        self.reencoded = dict.fromkeys(REENCODE_REASONS, 0)

    def add(self, built: Built, record: PlannedRecord, scratch: memoryview | None) -> None:
        reject = built.reject
        fields = unplace(built.fields, scratch) if built.fields is not None else None
        key = None
        if self.tar and (reject is None or reject[0] != "bad-key"):
            try:
                key = tar_key(record.key)
            except SchemaError as err:
                reject = ("bad-key", err.message)
            else:
                if key in self.keys:
                    reject = ("duplicate-key", f"key {display_key(key)!r} is already in this tar shard")
                elif self.label_index is not None and not 0 <= record.values[self.label_index] < MAX_CLASSES:
                    label = record.values[self.label_index]
                    reject = ("bad-label", f"label {label} is outside [0, {MAX_CLASSES}), which a .cls member holds")
        if reject is not None or fields is None:
            reason, detail = reject if reject is not None else ("corrupt", "no record was built")
            cause = "transient" if built.transient and reject == built.reject else "permanent"
            self.rejects.append([built.number, reason, detail, cause])
            return
        if self.writer is None:
            path = self.output.file_path(self.name)
            self.writer = TarShardWriter(path, labelled=self.labelled) if self.tar else ShardWriter(path, schema=self.plan.schema)
        if key is not None:  # a tar output's record: one without a key returned above, as a reject
            members = {f.name: encode_member(f.kind, fields[f.name], f"field {f.name!r}") for f in self.plan.fields if f.member}
            self.writer.write(key, image=fields["image"], label=fields.get("label"), members=members)
            self.keys.add(key)
        else:
            self.writer.write(fields)
        for reencoded in built.reencoded:
            if reencoded is None:
                self.passthrough += 1
            else:
                self.reencoded[reencoded] += 1

    def close(self, num_inputs: int) -> dict[str, Any]:
        """Close and commit the shard, then write its sidecar (a shard whose records were all
        rejected has a sidecar and no file); return the sidecar."""
        info = self.writer.close() if self.writer is not None else None
        self.writer = None
        index: dict[str, Any] | None = None
        if isinstance(info, TarShardInfo):
            index = {"path": info.index.path.name, "size": info.index.size, "checksum": format_checksum(info.index.checksum)}
            info = info.tar
        if info is not None:
            self.output.commit([self.name] if index is None else [self.name, index["path"]])
        sidecar: dict[str, Any] = {
            "index": self.index,
            "inputs": num_inputs,
            "path": self.name if info is not None else None,
            "num_records": info.num_records if info is not None else 0,
            "size": info.size if info is not None else 0,
            "checksum": format_checksum(info.checksum) if info is not None else None,
            "rejects": self.rejects,
            "passthrough": self.passthrough,
            "reencoded": self.reencoded,
        }
        if index is not None:
            sidecar["member_index"] = index
        self.output.write_sidecar(self.index, sidecar)
        return sidecar

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()
            self.writer = None


def _write_shard(
    plan: ConversionPlan,
    output: Output,
    index: int,
    chunks: list[Chunk],
    results: Iterator[tuple[list[Built], memoryview | None]],
    bar: Any,
) -> dict[str, Any]:
    """Write shard `index` from the built records of its `chunks`, taken from `results` in order."""
    sink = _Sink(plan, output, index)
    current: PlannedRecord | str = "(before the first input)"  # described only if something fails
    try:
        for chunk in chunks:
            try:
                built_chunk, scratch = next(results)
            except WorkerDied as err:
                raise WorkerError(
                    "a worker process died (killed, or out of memory?) before this shard was finished", path=output.describe(sink.name)
                ) from err
            except WorkerError as err:
                raise WorkerError(err.message, path=output.describe(sink.name)) from err
            for (_, record), built in zip(chunk.records, built_chunk, strict=True):
                current = record
                sink.add(built, record, scratch)
            bar.update(len(chunk.records))
        current = "(closing the shard)"
        start, stop = plan.shards[index]
        return sink.close(stop - start)
    except (WorkerError, RemoteError):
        raise  # a store that does not answer stops the run; the shard is redone on resume
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise
        raise WorkerError(f"input {_describe(current)}: {type(err).__name__}: {err}", path=output.describe(sink.name)) from err
    except Exception as err:
        raise WorkerError(f"input {_describe(current)}: {type(err).__name__}: {err}", path=output.describe(sink.name)) from err
    finally:
        sink.abort()


def disk_full_error(output: Output, *, device: str = "the output", doing: str = "") -> ConvertError:
    """The one line a full disk (ENOSPC) ends a conversion with (spec/conversion.md): `device`
    names whose device filled up, `doing` what was being written when it did."""
    return ConvertError(
        f"no space left on the device of {device}{doing}; nothing unfinished was kept under a final name: "
        "free some space, then run it again with resume=True to keep the finished shards and do the rest",
        path=output.location,
    )


def _describe(record: PlannedRecord | str) -> str:
    if isinstance(record, str):
        return record
    where = display_path(record.path)
    return where if record.sample_key is None else f"{where}: sample {display_key(record.sample_key)}"


def build_outputs(plan: ConversionPlan, sidecars: list[dict[str, Any]]) -> tuple[Manifest, list[dict[str, str]], bytes]:
    """Return the manifest, the rejects in input order and the bytes of rejects.jsonl."""
    ordered: list[tuple[tuple[int, int], dict[str, str]]] = [
        ((r.position, 0), _reject(r.path, r.reason, r.detail, r.key)) for r in plan.scan_rejects
    ]
    rejected: set[int] = set()
    for sidecar in sidecars:
        for number, reason, detail, *_ in sidecar["rejects"]:  # then the cause kind (`destination.redo_on_resume`)
            record = plan.records[number]
            key = display_path(record.sample_key) if record.sample_key is not None else None
            ordered.append(((number, 1), _reject(display_path(record.path), reason, detail, key)))
            rejected.add(number)
    ordered.sort(key=lambda pair: pair[0])
    rejects = [reject for _, reject in ordered]
    report = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rejects)
    at = plan.label_index
    labels = {record.values[at] for number, record in enumerate(plan.records) if number not in rejected} if at is not None else set()
    stats = {
        "inputs": len(plan.records),
        "input_bytes": plan.input_bytes,
        "passthrough": sum(s["passthrough"] for s in sidecars),
        "reencoded": {reason: sum(s["reencoded"][reason] for s in sidecars) for reason in REENCODE_REASONS},
        "empty_classes": len(plan.classes) - len(labels) if plan.classes is not None else 0,
        **plan.stats,
    }
    manifest = Manifest(
        schema=plan.schema,
        shards=tuple(_shard_entry(s) for s in sidecars if s["num_records"]),
        classes=list(plan.classes) if plan.classes is not None else None,
        shard_format=plan.shard_format,
        converter={"name": "shardfmt", "version": __version__, "input": plan.kind, "options": dict(plan.options)},
        rejects={"count": len(rejects), "by_reason": dict(Counter(reject["reason"] for reject in rejects)), "report": REJECTS_NAME},
        stats=stats,
        strict_jpeg=True,  # every kept JPEG passed the strict decode; the others are the encoder's
    )
    return manifest, rejects, report.encode()


def _reject(path: str, reason: str, detail: str, key: str | None = None) -> dict[str, str]:
    """A line of rejects.jsonl: path, reason, detail, and the key of a sample of a tar."""
    return {"path": path, "reason": reason, "detail": detail, **({"key": key} if key is not None else {})}


def _shard_entry(sidecar: dict[str, Any]) -> ShardEntry:
    index = sidecar.get("member_index")
    return ShardEntry(
        sidecar["path"],
        sidecar["num_records"],
        sidecar["size"],
        parse_checksum(sidecar["checksum"]),
        IndexEntry(index["path"], index["size"], parse_checksum(index["checksum"])) if index is not None else None,
    )
