"""Remote datasets, resumed under another world size: the shard order over an S3 dataset through the
node cache, driven as in-process ranks by the shared resume matrix; after a resume each rank tells
the dataset its new plan (``will_read``), which is exactly what it then reads."""

from __future__ import annotations

import numpy as np
import pytest
from remote_fixtures import images_folder, packed_folder, requires_s3, s3_dataset, s3_server  # noqa: F401
from resume_matrix import IteratedPath, Job, check_epoch, play

from fastload.loader import Loader, LoaderConfig
from fastload.records.remote.dataset import open_remote_dataset
from fastload.transforms import eval_transform

pytestmark = requires_s3


class RemoteRanks(IteratedPath):
    """``fastload.Loader`` in shard order over an S3 dataset; each rank its own dataset, one cache per job."""

    def __init__(self, url: str, options: dict, cache: str) -> None:
        self.name = "Loader(shard) over S3"
        self.url, self.options, self.cache = url, options, cache
        self.records = 48
        self.plans: dict[int, list[np.ndarray]] = {}

    def open(self, rank, world, batch):
        ds = open_remote_dataset(self.url, storage_options=self.options, cache_dir=self.cache, prefetch_shards=1)
        plans = self.plans.setdefault(id(ds), [])
        will_read = ds.will_read

        def recording(*parts):
            plans.append(np.asarray(parts[0], dtype=np.int64).copy())
            will_read(*parts)

        ds.will_read = recording
        config = LoaderConfig(
            batch_size=batch,
            transform=eval_transform(16, resize=18),
            shuffle="shard",
            seed=11,
            rank=rank,
            world_size=world,
            num_threads=1,
            prefetch=1,
            window=2,
        )
        return {"ds": ds, "loader": Loader(ds, config), "it": None, "plans": plans}

    def close(self, h):
        h["loader"].close()
        h["ds"].close()


@pytest.mark.parametrize("jobs", [[Job(4, 3, 1), Job(3, 4)], [Job(2, 5, 2), Job(3, 2, 1), Job(5, 3)]])
def test_shard_order_over_s3_resumes_under_another_world_size(s3_dataset, tmp_path, jobs):
    url, options = s3_dataset
    path = RemoteRanks(url, options, str(tmp_path / "cache"))
    check_epoch(path, play(path, 1, jobs, after=1), 1)


def test_the_resumed_plan_is_what_the_rank_reads(s3_dataset, tmp_path):
    url, options = s3_dataset
    path = RemoteRanks(url, options, str(tmp_path / "cache"))
    saver = path.open(0, 4, 3)
    try:
        path.set_epoch(saver, 0)
        path.take(saver, 2)
        state = path.state(saver)
    finally:
        path.close(saver)
    for rank in range(3):
        h = path.open(rank, 3, 4)
        try:
            path.load(h, state)
            got = np.concatenate(path.take(h, None))
            # The first plan after the resume: the rest of this epoch, in the order it is read.
            np.testing.assert_array_equal(h["plans"][0], got)
        finally:
            path.close(h)
