"""Running conversion tasks on a Ray cluster (``shardfmt convert --engine ray``).

Each planned shard is one Ray task calling the conversion's task runner (`task.run_shard_task`,
or `fieldtask.run_field_task` for multi-field records), exactly what a local worker runs, so the
bytes written do not depend on the engine. The tasks join the running cluster
(``ray.init(address="auto")``) or, when there is none, a Ray instance started on this machine
for the conversion. The output must be reachable from every node: a URL (``s3://...``) or a
shared file system. Ray is an optional dependency: ``pip install 'shardfmt[ray]'``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from ..errors import ConvertError, ShardfmtError, WorkerError
from .task import run_shard_task

__all__ = ["run_tasks_on_ray"]


def _run(runner: Callable[..., tuple[dict[str, Any], bool]], task: Any) -> tuple[dict[str, Any], bool]:
    return runner(task)


def run_tasks_on_ray(
    tasks: list[Any], *, progress: bool, runner: Callable[..., tuple[dict[str, Any], bool]] = run_shard_task
) -> list[tuple[dict[str, Any], bool]]:
    """Run every task (a `ShardTask`, or a `FieldTask` with its runner) on Ray and return their
    outcomes in task order.

    Raises:
        ConvertError: Ray is not installed.
        WorkerError: a task failed (the task's own error, naming the shard and input), or its
            worker died.
    """
    try:
        import ray
    except ImportError as err:
        raise ConvertError("--engine ray needs Ray: pip install 'shardfmt[ray]'") from err
    started_here = False
    if not ray.is_initialized():
        try:
            ray.init(address="auto", log_to_driver=False)
        except ConnectionError:  # no running cluster: start a local instance for this conversion
            ray.init(include_dashboard=False, log_to_driver=False)
        started_here = True
    try:
        remote_run = ray.remote(num_cpus=1, max_retries=1)(_run)
        refs = {remote_run.remote(runner, task): task.index for task in tasks}
        outcomes: dict[int, tuple[dict[str, Any], bool]] = {}
        pending = list(refs)
        with tqdm(total=len(tasks), unit="shard", desc="convert (ray)", disable=not progress) as bar:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    try:
                        outcomes[refs[ref]] = ray.get(ref)
                    except ray.exceptions.RayTaskError as err:
                        cause = getattr(err, "cause", None)
                        if isinstance(cause, ShardfmtError):
                            raise cause from err
                        raise WorkerError(f"a Ray task failed: {err}") from err
                    except ray.exceptions.RayError as err:
                        raise WorkerError(f"a Ray worker died before this shard was finished: {type(err).__name__}") from err
                    bar.update(1)
        return [outcomes[task.index] for task in tasks]
    finally:
        if started_here:
            ray.shutdown()
