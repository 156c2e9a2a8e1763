"""Epoch orders as pure functions: which record each rank's batch holds, in any epoch, computed
anywhere (a worker, a resumed run, a reader in another language; spec/sampling.md).

`keys` hashes (seed, stream, epoch, index) with SplitMix64 and builds the sorted-key and windowed
orders; `permutation` is the seeded Feistel bijection and the orders built on it; `orders` chooses
and builds an epoch's order; `ranks` cuts one rank's batches out of an order, batch by batch, and
resumes an epoch on another number of ranks; `mixture` draws exact per-source counts from several
datasets. Nothing here holds state or imports anything above the base layer.
"""
