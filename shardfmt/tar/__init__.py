"""WebDataset interop (spec/tar.md): the key rule (`keys`), a deterministic writer (`writer`), a
streaming member scanner (`scan`), the member index that lets a tar be read like a binary shard
(`index`) and its reader (`reader`).

A tar shard holds samples as members named ``KEY.EXTENSION``; shardfmt writes ``KEY.cls`` (the
label in ASCII decimal), ``KEY.jpg`` and optionally ``KEY.json``. Next to each tar lies its member
index ``NAME.tar.idx``: a binary shard with one record per sample that says where the image
member's bytes are, its size, checksum and label. `reader.TarShardReader` turns that index into
the same record table a `ShardReader` has, over a memory map of the tar, so the loader reads a tar
exactly as it reads a binary shard.
"""
