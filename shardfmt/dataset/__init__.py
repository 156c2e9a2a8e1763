"""Shards plus a manifest make a dataset: where one lives (`locate`), opening it (`reader`),
writing one (`writer`), indexing tars in place (`tars`), checking every byte (`verify`) and
describing it (`summary`)."""
