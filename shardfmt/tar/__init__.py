"""WebDataset interop (spec/tar.md), for those who write, scan or index tar shards themselves.

A tar shard holds samples as members named ``KEY.EXTENSION``; shardfmt writes ``KEY.cls`` (the
label in ASCII decimal), ``KEY.jpg`` and optionally ``KEY.json``. Next to each tar lies its member
index ``NAME.tar.idx``: a binary shard with one record per sample that says where the image
member's bytes are, its size, checksum and label, and every member's span and checksum. `TarShardReader` turns that index into the same
record table a `shardfmt.format.ShardReader` has, over a memory map of the tar, so the loader
reads a tar exactly as it reads a binary shard.

Most users need only `shardfmt.index_tars` and `shardfmt.open_dataset`. The modules of this
package (`_keys`: webdataset's key rule; `_writer`; `_scan`: a streaming member scanner;
`_index`; `_reader`) are internal; what is public is listed in `__all__`.
"""

from __future__ import annotations

from ._index import index_tar
from ._reader import TarShardReader
from ._scan import iter_tar_samples
from ._writer import TarShardWriter

__all__ = ["TarShardReader", "TarShardWriter", "index_tar", "iter_tar_samples"]
