"""Conversions whose source or output is a URL: the same plan, tasks and bytes as `convert`,
with the output written through a `Store`.

Writing to object storage keeps the local run's atomicity: a shard (and a tar shard's member
index) is staged on local disk and uploaded under its final name in one atomic PUT only once
complete (`destination.py`); the plan and the sidecars (the resume state) live in the output
under ``.shardfmt-work/``, so any machine can resume; ``rejects.jsonl`` and then
``manifest.json`` are uploaded last, and only then is the work prefix deleted. A prefix without
manifest.json is never read as a dataset.

A source given by URL is listed once (`sources/`) and each input is read with one GET
inside its task. Any mix works: local to remote, remote to remote, remote to a local folder.
WebDataset tars as a source must be local (they are read in place with ``pread``), and are
refused by URL. `run_plan_in_store` is the second half, shared with `fields.convert_fields`,
whose multi-field records may be written into a store from local sources.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConvertError
from ..format.manifest import MANIFEST_NAME
from ..format.schema import IMAGE_CLASSIFICATION, Schema
from ..storage import RemoteOptions, Store, open_store
from ..storage.urls import is_url
from .destination import WORK_DIR
from .run import (
    PLAN_NAME,
    REJECTS_NAME,
    ConvertResult,
    _compare_plans,
    _make_plan,
    _run_tasks,
    build_outputs,
    conclude,
)
from .sources import scan_source, source_name
from .sources.results import SourceScan
from .task import ShardTask, run_shard_task

__all__ = ["convert_with_store", "prepare_store", "run_plan_in_store"]

_OWN_KEY = re.compile(r"(manifest\.json|rejects\.jsonl|shard-\d{5,}\.(?:shard|tar|tar\.idx)|\.shardfmt-work/.*)\Z")


def convert_with_store(
    src: str,
    out: str,
    *,
    options: dict[str, Any],
    shard_format: str,
    workers: int | None,
    resume: bool,
    overwrite: bool,
    strict: bool,
    progress: bool,
    engine: str,
    remote: RemoteOptions | None,
    started: float,
) -> ConvertResult:
    """`convert` for a source or output given by URL (arguments as there, already checked).

    Raises:
        ConvertError: as `convert`; also for WebDataset tars given by URL as the source.
    """
    store, stored_plan = prepare_store(out, remote=remote, resume=resume, overwrite=overwrite)
    scan, root = _scan(src, remote)
    plan = _make_plan(scan, source_name(src, remote=remote), options, shard_format=shard_format)
    tasks = [
        ShardTask(
            index=index,
            root=root,
            out=out,
            inputs=tuple(
                (i, path, size, label, *member) for i, (path, size, _, label, *member) in enumerate(plan["inputs"][start:stop], start)
            ),
            max_side=options["max_side"],
            quality=options["quality"],
            shard_format=shard_format,
            remote=remote,
        )
        for index, (start, stop) in enumerate(plan["shards"])
    ]
    return run_plan_in_store(
        plan, tasks, runner=run_shard_task, schema=IMAGE_CLASSIFICATION, store=store, out=out, stored_plan=stored_plan,
        workers=workers, progress=progress, strict=strict, engine=engine, started=started,
    )


def prepare_store(out: str, *, remote: RemoteOptions | None, resume: bool, overwrite: bool) -> tuple[Store, bool]:
    """Open the output store and make sure it may be written: empty, resumable, or cleared of
    shardfmt's objects.

    Returns:
        The store, and whether it holds the plan of an interrupted conversion to check against.

    Raises:
        ConvertError: the store is read-only, or holds something that forbids writing there.
    """
    store = open_store(out, remote=remote)
    if not store.supports_writes:
        raise ConvertError("this store cannot be written (plain HTTP is read-only): use s3://, gs://, ...", path=store.root)
    existing = store.list()
    _prepare(store, existing, resume=resume, overwrite=overwrite)
    return store, f"{WORK_DIR}/{PLAN_NAME}" in existing and not overwrite


def run_plan_in_store(
    plan: dict[str, Any],
    tasks: Sequence[Any],
    *,
    runner: Callable[..., tuple[dict[str, Any], bool]],
    schema: Schema,
    store: Store,
    out: str,
    stored_plan: bool,
    workers: int | None,
    progress: bool,
    strict: bool,
    engine: str,
    started: float,
) -> ConvertResult:
    """`convert.run_plan` for an output store: store the plan (or check it against the stored
    one), run the tasks, then upload rejects.jsonl and manifest.json and delete the work prefix."""
    plan_key = f"{WORK_DIR}/{PLAN_NAME}"
    if stored_plan:
        try:
            stored = json.loads(store.get(plan_key))
        except (OSError, ValueError) as err:
            raise ConvertError(f"the stored plan cannot be read ({err}); use --overwrite to start again", path=store.describe(plan_key)) from err
        _compare_plans(stored, plan, where=store.root)
    else:
        store.put(plan_key, json.dumps(plan, sort_keys=True, separators=(",", ":")).encode())
    outcomes = _run_tasks(
        list(tasks), out=store.root, workers=workers if workers is not None else os.cpu_count() or 1, progress=progress,
        runner=runner, engine=engine,
    )
    manifest, rejects, report = build_outputs(plan, [sidecar for sidecar, _ in outcomes], schema=schema)
    store.put(REJECTS_NAME, report)
    store.put(MANIFEST_NAME, manifest.to_bytes())  # the commit point: last
    for key in sorted(store.list(WORK_DIR)):
        store.delete(key)
    if not is_url(out):
        _remove_empty_work_dirs(Path(out) / WORK_DIR)
    return conclude(
        path=store.root if is_url(out) else Path(out),
        manifest=manifest,
        plan=plan,
        outcomes=outcomes,
        rejects=rejects,
        started=started,
        strict=strict,
        rejects_at=store.describe(REJECTS_NAME),
        reject_path=lambda first: first["path"],
    )


def _prepare(store: Store, existing: dict[str, dict[str, object]], *, resume: bool, overwrite: bool) -> None:
    """Make sure the output may be written: empty, resumable, or cleared of shardfmt's objects."""
    if not existing:
        return
    if overwrite:
        for key in sorted(existing):
            if _OWN_KEY.match(key):
                store.delete(key)
        return
    if resume:
        if f"{WORK_DIR}/{PLAN_NAME}" in existing:
            return
        if MANIFEST_NAME in existing:
            raise ConvertError("the output holds a finished dataset: nothing to resume (use --overwrite to convert again)", path=store.root)
        raise ConvertError("the output holds no interrupted conversion to resume (no .shardfmt-work/plan.json)", path=store.root)
    raise ConvertError(
        "the output is not empty: use --resume to finish an interrupted conversion, or --overwrite to replace the dataset in it",
        path=store.root,
    )


def _scan(src: str, remote: RemoteOptions | None) -> tuple[SourceScan, str]:
    scan = scan_source(src, remote=remote)
    return scan, os.fspath(scan.root)


def _remove_empty_work_dirs(work: Path) -> None:
    for folder in sorted((p for p in work.rglob("*") if p.is_dir()), reverse=True):
        folder.rmdir()
    if work.is_dir():
        work.rmdir()
