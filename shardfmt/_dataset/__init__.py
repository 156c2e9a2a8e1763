"""Shards plus a manifest make a dataset: what a location string names and where a dataset lives
(`locate`: `classify_location`, `locate_dataset`), opening it (`reader`), writing one (`writer`),
indexing tars in place (`tars`), checking every byte (`verify`) and describing it (`summary`)."""
