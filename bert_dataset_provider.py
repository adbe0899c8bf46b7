"""The interface both pretraining data providers implement (NVIDIA hdf5, Bing numpy).

The step loop drives a provider like this, once per epoch `index`:

    refs, total = provider.get_shard(index)      # iterable of batch references, its length
                                                 # (start_batch=N, keyword only: skip N micro batches)
    provider.prefetch_shard(index + 1)           # start loading the next epoch's shard
    for ref in refs:
        batch = provider.get_batch(ref)          # a turing.batch.Batch
        ...
        provider.prefetch_batch()                # keep the prefetch window full
    provider.release_shard(index)
"""


class BertDatasetProviderInterface:
    def get_shard(self, index, *, start_batch=0):
        raise NotImplementedError

    def release_shard(self, index):
        raise NotImplementedError

    def prefetch_shard(self, index):
        raise NotImplementedError

    def get_batch(self, batch_iter):
        raise NotImplementedError

    def prefetch_batch(self):
        raise NotImplementedError
