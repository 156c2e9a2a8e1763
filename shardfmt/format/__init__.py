"""The binary shard, byte for byte (spec/format.md): the layout constants and limits (`layout`),
the field types (`fieldtypes`: each type's columns, encoding, checks and decoding), JPEG header
parsing, the schema, the manifest, `ShardWriter` and `ShardReader`. Knows nothing of tars,
datasets of many shards, conversion or loading."""
