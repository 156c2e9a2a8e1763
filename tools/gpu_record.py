"""Gather the GPU machine's results into one record (docs/bench_gpu.json) and its chart.

Reads what tools/gpu_check.sh had tools/bench_loader.py (``--scaling``), tools/bench_gpu.py and
tools/bench_train.py write, and writes the record: the device as CUDA names it, the worker count,
the loader rates (CPU workers, nvJPEG, hybrid), the training rates and GPU wait fractions
(shardfmt, PIL DataLoader), the scaling table, the pixel agreement, the commands and the date;
and a chart of the loader and training rates and of the scaling against the decode limit.

Usage::

    python tools/gpu_record.py --scaling scaling.json --loader loader_gpu.json --train train.json \\
        --commands commands.txt --json bench_gpu.json --chart bench_gpu.png
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def load(path: Path | None) -> dict[str, Any] | None:
    if path is None or not path.exists():
        return None
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def by_name(rows: list[dict[str, Any]], prefix: str) -> dict[str, Any] | None:
    return next((row for row in rows if row["name"].startswith(prefix)), None)


def build_record(
    scaling: dict[str, Any] | None, loader: dict[str, Any] | None, train: dict[str, Any] | None, commands: list[str]
) -> dict[str, Any]:
    record: dict[str, Any] = {"device": None, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if loader is not None:
        rows = loader["results"]
        record |= {
            "device": loader["device"],
            "cpu_workers": loader["settings"]["workers"],
            "batch_size": loader["settings"]["batch_size"],
            "images": loader["settings"]["images"],
            "cpu_model": loader["machine"]["cpu_model"],
            "cpu_count": loader["machine"]["cpu_count"],
            "torch": loader["machine"]["torch"],
            "cpu_loader_images_per_s": by_name(rows, "cpu")["images_per_second"],  # type: ignore[index]
            "gpu_decode_images_per_s": by_name(rows, "gpu")["images_per_second"],  # type: ignore[index]
            "hybrid_images_per_s": by_name(rows, "hybrid")["images_per_second"],  # type: ignore[index]
            "hybrid_gpu_share": by_name(rows, "hybrid")["gpu_share"],  # type: ignore[index]
            "hybrid_one_worker_fewer_images_per_s": rows[3]["images_per_second"] if len(rows) > 3 else None,
            "hybrid_over_cpu": loader["hybrid_over_cpu"],
            "nvjpeg_alone_images_per_s": loader["nvjpeg"]["images_per_second"],
            "pixels_gpu_vs_cpu_exact": loader["pixels"],
        }
    if train is not None:
        rows = train["results"]
        shardfmt_cpu, hybrid, pil = by_name(rows, "shardfmt cpu"), by_name(rows, "shardfmt hybrid"), by_name(rows, "PIL")
        record |= {
            "device": record["device"] or train["device"],
            "train_model": "torchvision resnet50, channels_last, bf16 autocast, SGD",
            "train_batch_size": train["settings"]["batch_size"],
            "train_steps_per_feeder": train["settings"]["steps"],
            "train_images_per_s_synthetic": train["synthetic_images_per_second"],
            "train_images_per_s_shardfmt": shardfmt_cpu["images_per_second"] if shardfmt_cpu else None,
            "gpu_wait_fraction_shardfmt": shardfmt_cpu["gpu_wait_fraction"] if shardfmt_cpu else None,
            "train_images_per_s_shardfmt_hybrid": hybrid["images_per_second"] if hybrid else None,
            "gpu_wait_fraction_shardfmt_hybrid": hybrid["gpu_wait_fraction"] if hybrid else None,
            "train_images_per_s_dataloader_pil": pil["images_per_second"] if pil else None,
            "gpu_wait_fraction_dataloader_pil": pil["gpu_wait_fraction"] if pil else None,
        }
        if train.get("overlap"):
            overlap = train["overlap"]
            record["side_stream"] = {
                "step_ms_side_stream": overlap["side_stream"]["step_ms"],
                "step_ms_training_stream": overlap["training_stream"]["step_ms"],
                "step_ms_saved": overlap["step_ms_saved"],
            }
    if scaling is not None:
        record["decode_limit_one_core_images_per_s"] = scaling["decode_limit_one_core"]["one_core_exact_images_per_second"]
        record["scaling"] = [
            {key: row[key] for key in ("workers", "images_per_second", "decode_limit_images_per_second", "ratio_to_limit")}
            for row in scaling["scaling"]
        ]
    record["commands"] = commands
    return record


def write_chart(path: Path, record: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    bars = [
        ("loader: CPU workers", record.get("cpu_loader_images_per_s")),
        ("loader: decode='gpu'", record.get("gpu_decode_images_per_s")),
        ("loader: decode='hybrid'", record.get("hybrid_images_per_s")),
        ("train: shardfmt CPU workers", record.get("train_images_per_s_shardfmt")),
        ("train: shardfmt hybrid", record.get("train_images_per_s_shardfmt_hybrid")),
        ("train: PIL DataLoader", record.get("train_images_per_s_dataloader_pil")),
    ]
    bars = [(name, value) for name, value in bars if value is not None][::-1]
    drawn = left.barh(
        [name for name, _ in bars], [value for _, value in bars], color=["#4c72b0" if "PIL" not in name else "#8c8c8c" for name, _ in bars]
    )
    left.bar_label(drawn, fmt="%.0f", padding=3)
    left.set_xlabel("images/s")
    left.set_xlim(0, 1.2 * max([value for _, value in bars] + [1.0]))
    left.set_title(f"{record.get('device')}, {record.get('cpu_workers')} workers, batch {record.get('batch_size')}", fontsize=9)
    scaling = record.get("scaling") or []
    if scaling:
        workers = [row["workers"] for row in scaling]
        right.plot(workers, [row["images_per_second"] for row in scaling], "o-", label="shardfmt Loader")
        right.plot(
            workers,
            [row["decode_limit_images_per_second"] for row in scaling],
            "--",
            color="#c44e52",
            label="decode limit (1 core x workers)",
        )
        for row in scaling:
            right.annotate(
                f"{row['ratio_to_limit']:.2f}x",
                (row["workers"], row["images_per_second"]),
                textcoords="offset points",
                xytext=(4, -12),
                fontsize=8,
            )
        right.set_xscale("log", base=2)
        right.set_xticks(workers, [str(w) for w in workers])
        right.set_xlabel("workers")
        right.set_ylabel("images/s")
        right.legend(fontsize=8)
        right.set_title("scaling with cores (RandomResizedCrop 224 + flip)", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--scaling", type=Path)
    parser.add_argument("--loader", type=Path)
    parser.add_argument("--train", type=Path)
    parser.add_argument("--commands", type=Path, help="a file of the commands run, one a line")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--chart", type=Path)
    args = parser.parse_args(argv)
    commands = [line for line in args.commands.read_text().splitlines() if line.strip()] if args.commands and args.commands.exists() else []
    record = build_record(load(args.scaling), load(args.loader), load(args.train), commands)
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    if args.chart is not None and record.get("device") is not None:
        write_chart(args.chart, record)
    print(json.dumps({k: v for k, v in record.items() if k not in ("commands", "scaling")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
