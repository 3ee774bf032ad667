"""A site's training DataLoader: built for one round, or kept by a site process with persistent workers.

A per-message ClientApp (``persistent=False``) builds it in every round. A site process
(``persistent=True``) builds it once and keeps it: with ``train.num_workers > 0`` its worker
processes live on between rounds (``persistent_workers``), holding the dataset they were given
(every record the site may train on: the round's subset is chosen by index, never by a new dataset).
Either way a round's order and augmentation come from the round's seed alone
(``common/datasets/round_sampling.py``), so both train the same, at any ``num_workers``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from common.datasets.round_sampling import RoundBatches, SeededSamples


class RoundLoader:
    def __init__(self, dataset: Dataset, *, batch_size: int, num_workers: int, persistent: bool) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.persistent = persistent and num_workers > 0
        self._batches: RoundBatches | None = None
        self._loader: DataLoader | None = None
        self._in_round = False

    def round(self, seed: int, indices: Sequence[int], *, drop_last: bool) -> DataLoader:
        """The loader of a round: ``indices`` of the dataset, shuffled and augmented from ``seed``.

        After a round that did not finish (:meth:`finished` not called: it failed) the workers
        are replaced: nothing of a broken round (a dead worker, batches in flight) is reused.
        """
        if self._in_round:
            self.close()
        if self._loader is None:
            self._batches = RoundBatches(self.batch_size)
            self._loader = DataLoader(
                SeededSamples(self.dataset),
                batch_sampler=self._batches,
                num_workers=self.num_workers,
                persistent_workers=self.persistent,
                # only the workers' base seed (nothing here draws from it): never torch's global generator
                generator=torch.Generator().manual_seed(0),
            )
        self._batches.start_round(seed, indices, drop_last=drop_last)
        self._in_round = True
        return self._loader

    def finished(self) -> None:
        """The round's training ended normally."""
        self._in_round = False

    def close(self) -> None:
        """Stop the persistent workers (a site process ending or rebuilding its site)."""
        loader, self._loader, self._batches, self._in_round = self._loader, None, None, False
        # DataLoader has no public call that stops persistent workers: its iterator owns them
        it = getattr(loader, "_iterator", None)
        if it is not None:
            it._shutdown_workers()
