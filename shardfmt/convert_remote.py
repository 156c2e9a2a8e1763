"""Conversions whose source or output is a URL: the same plan, tasks and bytes as `convert`,
with the output written through a `Store`.

Writing to object storage keeps the local run's atomicity: a shard is staged on local disk and
uploaded under its final name in one atomic PUT only once complete (`destination.py`); the plan
and the sidecars (the resume state) live in the output under ``.shardfmt-work/``, so any machine
can resume; ``rejects.jsonl`` and then ``manifest.json`` are uploaded last, and only then is the
work prefix deleted. A prefix without manifest.json is never read as a dataset.

A source given by URL is listed once (`scan_remote.py`) and each input is read with one GET
inside its task. Any mix works: local to remote, remote to remote, remote to a local folder.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from .convert import (
    PLAN_NAME,
    REJECTS_NAME,
    ConvertResult,
    _compare_plans,
    _make_plan,
    _run_tasks,
    build_outputs,
)
from .destination import WORK_DIR
from .errors import ConvertError
from .manifest import MANIFEST_NAME
from .scan import SourceScan, scan_source
from .scan_remote import scan_remote_source
from .storage import RemoteOptions, Store, open_store
from .storage.urls import is_url
from .task import ShardTask

__all__ = ["convert_with_store"]

_OWN_KEY = re.compile(r"(manifest\.json|rejects\.jsonl|shard-\d{5,}\.shard|\.shardfmt-work/.*)\Z")


def convert_with_store(
    src: str,
    out: str,
    *,
    options: dict[str, Any],
    workers: int | None,
    resume: bool,
    overwrite: bool,
    strict: bool,
    progress: bool,
    engine: str,
    remote: RemoteOptions | None,
    started: float,
) -> ConvertResult:
    """`convert` for a source or output given by URL (arguments as there, already checked)."""
    store = open_store(out, remote=remote)
    if not store.supports_writes:
        raise ConvertError("this store cannot be written (plain HTTP is read-only): use s3://, gs://, ...", path=store.root)
    existing = store.list()
    _prepare(store, existing, resume=resume, overwrite=overwrite)
    scan, root = _scan(src, remote)
    plan = _make_plan(scan, _source_name(src, remote), options)
    plan_key = f"{WORK_DIR}/{PLAN_NAME}"
    if plan_key in existing and not overwrite:
        try:
            stored = json.loads(store.get(plan_key))
        except (OSError, ValueError) as err:
            raise ConvertError(f"the stored plan cannot be read ({err}); use --overwrite to start again", path=store.describe(plan_key)) from err
        _compare_plans(stored, plan, where=store.root)
    else:
        store.put(plan_key, json.dumps(plan, sort_keys=True, separators=(",", ":")).encode())
    tasks = [
        ShardTask(
            index=index,
            root=root,
            out=out,
            inputs=tuple((i, path, size, label) for i, (path, size, _, label) in enumerate(plan["inputs"][start:stop], start)),
            max_side=options["max_side"],
            quality=options["quality"],
            remote=remote,
        )
        for index, (start, stop) in enumerate(plan["shards"])
    ]
    outcomes = _run_tasks(tasks, out=store.root, workers=workers if workers is not None else os.cpu_count() or 1, progress=progress, engine=engine)
    manifest, rejects, report = build_outputs(plan, [sidecar for sidecar, _ in outcomes])
    store.put(REJECTS_NAME, report)
    store.put(MANIFEST_NAME, manifest.to_bytes())  # the commit point: last
    for key in sorted(store.list(WORK_DIR)):
        store.delete(key)
    if not is_url(out):
        _remove_empty_work_dirs(Path(out) / WORK_DIR)
    result = ConvertResult(
        path=store.root if is_url(out) else Path(out),
        manifest=manifest,
        num_inputs=len(plan["inputs"]),
        num_records=manifest.num_records,
        num_rejects=len(rejects),
        input_bytes=sum(item[1] for item in plan["inputs"]),
        reused_shards=sum(reused for _, reused in outcomes),
        seconds=time.perf_counter() - started,
    )
    if strict and rejects:
        first = rejects[0]
        raise ConvertError(
            f"{first['reason']}: {first['detail']} (the first of {len(rejects)} rejects; --strict; all are in {store.describe(REJECTS_NAME)})",
            path=first["path"],
        )
    return result


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
    if is_url(src):
        return scan_remote_source(src, remote=remote)
    scan = scan_source(src)
    return scan, os.fspath(scan.root)


def _source_name(src: str, remote: RemoteOptions | None) -> str:
    """How the plan names the source: the resolved path, or the URL without credentials."""
    if is_url(src):
        return open_store(src, remote=remote).root
    return str(Path(src).resolve())


def _remove_empty_work_dirs(work: Path) -> None:
    for folder in sorted((p for p in work.rglob("*") if p.is_dir()), reverse=True):
        folder.rmdir()
    if work.is_dir():
        work.rmdir()
