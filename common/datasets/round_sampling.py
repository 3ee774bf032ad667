"""A training round's batches and each sample's random augmentation, drawn from the round's seed alone.

The draws do not depend on which process loads a sample (the main process or any DataLoader
worker), in which order, or on what that process drew before: a site trains the same at
``num_workers=0`` and with persistent workers kept across rounds (``client/runtime/round_loader.py``).

- :class:`RoundBatches` (the loader's batch sampler, in the main process): each pass over the
  round's indices is a permutation from the round's generator, and every index comes as a key
  ``(pass_seed, i)``, ``pass_seed = stable_seed(round seed, pass number)``;
- :class:`SeededSamples` (the dataset the workers hold): item ``(pass_seed, i)`` is ``dataset[i]``
  with torch's CPU generator seeded by ``stable_seed(pass_seed, i)`` and restored afterwards, so
  the torchvision transforms (they draw from torch's global generator, ``common/datasets/transforms.py``,
  ``face_images.py``) draw the sample's own stream, and the caller's global stream is untouched.
  Two views of one sample (``ImageDataset(views=2)``) are two successive draws of that stream.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Dataset, Sampler

from common.seeding import stable_seed

SampleKey = tuple[int, int]  # (pass_seed, index into the dataset)


class SeededSamples(Dataset):
    """``dataset[i]`` drawn from the seed of key ``(pass_seed, i)``; the global torch generator is left as it was.

    Only torch's generator is seeded: the datasets here draw nothing from ``random`` or numpy.
    """

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: SampleKey):
        pass_seed, i = key
        # torch.random.fork_rng and torch.manual_seed would touch the accelerator's generators too
        # (manual_seed reseeds CUDA's: the dropout stream of a GPU site training at num_workers=0)
        cpu = torch.default_generator
        state = cpu.get_state()
        cpu.manual_seed(stable_seed(pass_seed, i))
        try:
            return self.dataset[i]
        finally:
            cpu.set_state(state)


class RoundBatches(Sampler[list[SampleKey]]):
    """Batches of keys of one round's indices, shuffled anew in each pass over them.

    ``start_round`` sets the round (its seed, the indices it trains on, whether a last short batch
    is dropped) before the round's first pass; the order of pass p is the p-th permutation of the
    round's generator, its augmentation seed ``stable_seed(seed, p)``.
    """

    def __init__(self, batch_size: int):
        if batch_size < 1:
            raise ValueError(f"batch_size: expected >= 1, found {batch_size}")
        self.batch_size = batch_size
        self._indices: torch.Tensor | None = None
        self._seed = 0
        self._pass = 0
        self._drop_last = False
        self._generator = torch.Generator()

    def start_round(self, seed: int, indices: Sequence[int], *, drop_last: bool) -> None:
        self._seed = seed
        self._indices = torch.as_tensor(list(indices), dtype=torch.long)
        self._drop_last = drop_last
        self._pass = 0
        self._generator.manual_seed(seed)

    def __len__(self) -> int:
        n = len(self._require())
        return n // self.batch_size if self._drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[list[SampleKey]]:
        indices = self._require()
        self._pass += 1
        pass_seed = stable_seed(self._seed, self._pass)
        order = indices[torch.randperm(len(indices), generator=self._generator)].tolist()
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            if len(batch) < self.batch_size and self._drop_last:
                return
            yield [(pass_seed, i) for i in batch]

    def _require(self) -> torch.Tensor:
        if self._indices is None:
            raise RuntimeError("RoundBatches: no round set; call start_round(seed, indices, drop_last=...) first")
        return self._indices
