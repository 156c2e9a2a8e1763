"""Where a conversion writes: one class over a `Store`, for a local folder and for a bucket prefix.

The output holds ``shard-NNNNN.shard`` (or ``.tar`` with its ``.tar.idx``) files, then
``rejects.jsonl`` and, last, ``manifest.json``: the commit point. Until then
``.shardfmt-work/`` holds the plan and one sidecar per finished shard, so the resume state lives
with the output and any machine can resume.

A shard is written to a local file and committed: in a local folder it is written in place
under a temporary name, fsynced and renamed; for a store given by URL it is written to a local
staging folder and uploaded under its final name in one atomic PUT (an object store shows an
object whole or not at all). Its sidecar is written after it. A finished shard is one whose
sidecar exists and whose files agree with it: re-hashed when local, by size in a store (an object
under its final name is always a complete upload), and that holds no reject whose cause may pass
(`redo_on_resume`).

A store that does not answer within its retries stops the conversion (`stopped_by`): the error
says that the finished shards are kept and how to resume, and whether the lock object was left.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from .._checksum import file_checksum, parse_checksum
from .._errors import ConvertError, RemoteError
from .._storage import LocalStore, RemoteOptions, Store, open_store
from .._storage.atomic import fsync_directory
from .._storage.lock import LOCK_NAME, StoreLock
from .._storage.urls import is_url, local_path
from ..format._manifest import MANIFEST_NAME, Manifest
from ..format._writer import shard_name

__all__ = ["PLAN_NAME", "REJECTS_NAME", "WORK_DIR", "Output", "cli_wording", "redo_on_resume", "shard_file_name", "stopped_by"]

WORK_DIR: Final = ".shardfmt-work"
"""Folder inside the output that holds the plan and the sidecars until the manifest is written."""
PLAN_NAME: Final = "plan.json"
REJECTS_NAME: Final = "rejects.jsonl"
_OWN_NAME = re.compile(r"(manifest\.json|rejects\.jsonl|shard-\d{5,}\.(?:shard|tar|tar\.idx)|\.shardfmt-work)\Z")
_OWN_TEMP = re.compile(r"\.(manifest\.json|rejects\.jsonl|shard-\d{5,}\.(?:shard|tar|tar\.idx))\.tmp-\d+\Z")
_WORK_TEMP = re.compile(r"\.shardfmt-work/\..+\.tmp-\d+\Z")


def shard_file_name(index: int, shard_format: str) -> str:
    """The file name of shard `index`: ``shard-00000.shard``, or ``shard-00000.tar`` for tars."""
    return shard_name(index) if shard_format == "binary" else shard_name(index, suffix=".tar")


def _sidecar_key(index: int) -> str:
    return f"{WORK_DIR}/shard-{index:05d}.json"


def _is_own(name: str) -> bool:
    return bool(_OWN_NAME.match(name) or _OWN_TEMP.match(name))


def redo_on_resume(sidecar: dict[str, Any]) -> bool:
    """True if a finished shard must be built again on resume: one of its rejects has a cause
    that may pass (an entry ``[number, reason, detail, "transient"]``), or is an "unreadable"
    reject of a run that recorded no cause (whose outages became rejects); or is not such a list."""
    rejects = sidecar.get("rejects")
    if not isinstance(rejects, list):
        return True
    for entry in rejects:
        if not isinstance(entry, list) or len(entry) < 3:
            return True
        cause = entry[3] if len(entry) > 3 else None
        if cause == "transient" or (cause is None and entry[1] == "unreadable"):
            return True
    return False


def stopped_by(err: RemoteError, *, lock: str | None) -> RemoteError:
    """The error that ends a conversion a store failed: `err`'s message, then what was kept and
    how to go on (with the Python keywords; `cli_wording` gives the command line's flags);
    `lock` names the lock object the run could not remove, if any."""
    when = "once the store answers again" if err.transient else "once that is fixed"
    text = (
        f"{err.message}; the conversion stopped: the shards finished so far are kept, no input was rejected for this "
        f"failure and manifest.json is not written; {when}, run the same conversion with resume=True"
    )
    if lock is not None:
        text += (
            f" and break_lock=True: this run's lock object {lock} could not be removed, and breaking it is safe "
            "while no other run converts into this output"
        )
    return RemoteError(text, path=err.path, transient=err.transient)


_CLI_FLAGS: Final = (
    ("run it again with resume=True", "run the same command with --resume"),
    ("resume=True and overwrite=True", "--resume and --overwrite"),
    ("patch= and max_side=", "--patch and --max-side"),
    ("resume=True", "--resume"),
    ("break_lock=True", "--break-lock"),
    ("allow_empty=True", "--allow-empty"),
    ("overwrite=True", "--overwrite"),
    ("strict=True", "--strict"),
    ("image_root=", "--image-root"),
)
"""Python keywords in messages, and the command line's flags for them (`cli_wording`)."""
_CLI_FIELD: Final = re.compile(r"fields=\{'([A-Za-z_][A-Za-z0-9_]*)': '([a-z0-9]+)'\}")


def cli_wording(text: str) -> str:
    """`text` (a message raised from Python, which names keyword arguments: ``allow_empty=True``,
    ``fields={'caption': 'str'}``) with the command line's flags for them (``--allow-empty``,
    ``--field caption=str``)."""
    for keyword, flag in _CLI_FLAGS:
        text = text.replace(keyword, flag)
    return _CLI_FIELD.sub(r"--field \1=\2", text)


class Output:
    """The output of one conversion (see the module docstring); use `Output.open`.

    Attributes:
        store: where the files go.
        location: how results name the output: a `Path`, or the URL without credentials.
        has_plan: the output holds the plan of an interrupted conversion.
        finished: opened to resume, the manifest of the finished dataset it already holds
            (there is nothing to resume: `loop.already_finished` reports it), else None.
    """

    def __init__(self, store: Store, location: Path | str, *, has_plan: bool, lock: StoreLock | None = None, created: bool = False) -> None:
        self.store = store
        self.location = location
        self.has_plan = has_plan
        self.finished: Manifest | None = None
        self._local = store.path if isinstance(store, LocalStore) else None
        self._staging: Path | None = None
        self._lock = lock
        self._created = created

    @classmethod
    def open(
        cls, out: str | os.PathLike[str], *, remote: RemoteOptions | None, resume: bool, overwrite: bool, break_lock: bool = False
    ) -> Output:
        """Open `out` (a folder, created if missing, or a URL), take its lock (`storage.lock`) and
        make sure it may be written: empty, holding an interrupted conversion to resume, or
        cleared of shardfmt's files. `close()` gives the lock back.

        Raises:
            LockedError: another run holds the output's lock.
            ConvertError: `out` is not a folder, cannot be written (plain HTTP), or holds
                something that forbids writing there.
        """
        text = os.fspath(out)
        if is_url(text):
            store = open_store(text, remote=remote)
            location: Path | str = store.root
            if not store.supports_writes:
                raise ConvertError("this store cannot be written (plain HTTP is read-only): use s3://, gs://, ...", path=store.root)
        else:
            path = Path(local_path(text))
            if path.exists() and not path.is_dir():
                raise ConvertError("the output exists and is not a folder", path=path)
            created = not path.exists()
            path.mkdir(parents=True, exist_ok=True)
            store, location = LocalStore(path), path
        lock = StoreLock(store, purpose="converting into this output", break_lock=break_lock)
        output = cls(store, location, has_plan=False, lock=lock, created=not is_url(text) and created)
        try:
            output._prepare(resume=resume, overwrite=overwrite)
        except BaseException as err:
            output._close_after(err)
            raise
        return output

    def _entries(self) -> tuple[list[str], dict[str, dict[str, object]]]:
        """The output's top-level names, and every file under it."""
        keys = {key: info for key, info in self.store.list().items() if key != LOCK_NAME}
        if self._local is not None:
            return sorted(name for name in os.listdir(self._local) if name != LOCK_NAME), keys
        return sorted({key.split("/", 1)[0] for key in keys}), keys

    def _prepare(self, *, resume: bool, overwrite: bool) -> None:
        names, keys = self._entries()
        plan_key = f"{WORK_DIR}/{PLAN_NAME}"
        if not names:
            return
        if overwrite:
            self._remove_own(names, keys)
            return
        if resume:
            if plan_key in keys:
                self.has_plan = True
                self._remove_temp_files(keys)
                return
            if MANIFEST_NAME in names:  # the run that was killed had finished: a retry has nothing to do
                self.finished = Manifest.from_bytes(self.store.get(MANIFEST_NAME), path=self.store.describe(MANIFEST_NAME))
                return
            if all(_is_own(name) for name in names):  # stopped before the plan was written
                self._remove_own(names, keys)
                return
            raise ConvertError("the output holds no interrupted conversion to resume (no .shardfmt-work/plan.json)", path=self.location)
        raise ConvertError(
            "the output folder is not empty: use resume=True to finish an interrupted conversion, or overwrite=True to replace the dataset "
            "in it",
            path=self.location,
        )

    def _remove_own(self, names: Sequence[str], keys: dict[str, dict[str, object]]) -> None:
        own = {name for name in names if _is_own(name)}
        for key in sorted(keys):
            if key.split("/", 1)[0] in own:
                self.store.delete(key)
        if self._local is not None:
            for name in own:
                path = self._local / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif path.exists() or path.is_symlink():
                    path.unlink()

    def _remove_temp_files(self, keys: dict[str, dict[str, object]]) -> None:
        """Remove the temporary files a killed run left behind (its shards in progress)."""
        for key in keys:
            if _OWN_TEMP.match(key) or _WORK_TEMP.match(key):
                self.store.delete(key)

    def describe(self, name: str) -> str:
        """How messages name file `name` of the output (no credentials)."""
        return self.store.describe(name)

    # -- the plan and the sidecars ------------------------------------------------------------

    def read_plan(self) -> Any:
        """The stored plan of the interrupted conversion, as JSON values.

        Raises:
            ConvertError: it cannot be read.
        """
        key = f"{WORK_DIR}/{PLAN_NAME}"
        try:
            return json.loads(self.store.get(key))
        except RemoteError:
            raise  # the store did not answer: nothing is known about the plan
        except (OSError, ValueError) as err:
            raise ConvertError(f"the stored plan cannot be read ({err}); use overwrite=True to start again",
                               path=self.describe(key)) from err

    def write_plan(self, data: bytes) -> None:
        self.store.put(f"{WORK_DIR}/{PLAN_NAME}", data)

    def write_sidecar(self, index: int, sidecar: dict[str, Any]) -> None:
        self.store.put(_sidecar_key(index), json.dumps(sidecar, sort_keys=True).encode())

    def finished_sidecar(self, index: int, *, num_records: int, shard_format: str) -> dict[str, Any] | None:
        """The sidecar of shard `index` if a previous run finished it for `num_records` planned
        records and its files agree with it; else None."""
        try:
            sidecar = json.loads(self.store.get(_sidecar_key(index)))
        except RemoteError as err:
            if err.transient:
                raise  # the store did not answer: whether the shard is finished is unknown
            return None
        except (OSError, ValueError):
            return None
        if not isinstance(sidecar, dict) or sidecar.get("index") != index or sidecar.get("inputs") != num_records:
            return None
        if redo_on_resume(sidecar):
            return None
        if sidecar.get("num_records") == 0:
            return sidecar
        try:
            files = [(shard_file_name(index, shard_format), sidecar)]
            if shard_format == "tar":
                files.append((sidecar["member_index"]["path"], sidecar["member_index"]))
            return sidecar if all(self._file_matches(name, expected) for name, expected in files) else None
        except RemoteError as err:
            if err.transient:
                raise
            return None
        except (OSError, KeyError, TypeError, ValueError):
            return None

    def _file_matches(self, name: str, expected: dict[str, Any]) -> bool:
        if self._local is not None:
            size, digest = file_checksum(self._local / name)
            return size == expected["size"] and digest == parse_checksum(expected["checksum"])
        return bool(self.store.list(name).get(name, {}).get("size") == expected["size"])

    @contextlib.contextmanager
    def scratch_folder(self, name: str) -> Iterator[Path]:
        """A folder for inputs prepared for this conversion (decompressed tars): in the work
        folder of a local output, kept there for a resumed run until the manifest is written
        (and removed if the run stops before its plan is written); elsewhere a temporary folder
        removed when the block ends."""
        if self._local is None:
            with tempfile.TemporaryDirectory(prefix=f"shardfmt-{name}-") as temporary:
                yield Path(temporary)
            return
        folder = self._local / WORK_DIR / name
        try:
            yield folder
        except BaseException:
            if not (self._local / WORK_DIR / PLAN_NAME).exists():
                shutil.rmtree(folder, ignore_errors=True)
                with contextlib.suppress(OSError):
                    (self._local / WORK_DIR).rmdir()
            raise

    # -- shard files --------------------------------------------------------------------------

    def file_path(self, name: str) -> Path:
        """Where a writer puts file `name`: in place (written under a temporary name and renamed
        by the writer) for a local folder, else in a local staging folder until `commit`."""
        if self._local is not None:
            return self._local / name
        if self._staging is None:
            self._staging = Path(tempfile.mkdtemp(prefix="shardfmt-staging-"))
        return self._staging / name

    def commit(self, names: Sequence[str]) -> None:
        """Make written files final: upload each staged file in one atomic PUT, then drop it."""
        if self._local is not None:
            return
        for name in names:
            staged = self.file_path(name)
            self.store.put_file(name, os.fspath(staged))
            staged.unlink()

    def drop_staging(self) -> None:
        """Remove the staging folder, if any."""
        if self._staging is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(self._staging)
            self._staging = None

    def close(self) -> None:
        """Remove the staging folder, give the lock back, and remove the output folder if this
        run created it and left nothing in it."""
        self.drop_staging()
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if self._created and self._local is not None:
            with contextlib.suppress(OSError):
                self._local.rmdir()  # only when empty

    def _close_after(self, err: BaseException | None) -> None:
        """`close`; after a store's failure `err`, raise `stopped_by`'s error instead."""
        lock = self._lock
        self.close()
        if isinstance(err, RemoteError):
            left = lock is not None and lock.left
            raise stopped_by(err, lock=self.describe(LOCK_NAME) if left else None) from err

    def __enter__(self) -> Output:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, traceback: object) -> None:
        self._close_after(exc)

    # -- the commit point ---------------------------------------------------------------------

    def finish(self, manifest: Manifest, rejects_report: bytes) -> None:
        """Write rejects.jsonl, then manifest.json (the commit point), then remove the work folder."""
        self.store.put(REJECTS_NAME, rejects_report)
        self.store.put(MANIFEST_NAME, manifest.to_bytes())
        if self._local is not None:
            shutil.rmtree(self._local / WORK_DIR)
            fsync_directory(self._local)
            return
        plan_key = f"{WORK_DIR}/{PLAN_NAME}"
        for key in sorted(self.store.list(WORK_DIR), key=lambda k: k == plan_key):  # the plan last: until then, resumable
            self.store.delete(key)
