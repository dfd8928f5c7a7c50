"""Device stage (torch): state_dict / load_state_dict resume exactly, for every kind of sampler.

Each test runs an uninterrupted reference, then a run that stops mid-pass (or between passes),
saves the state, and continues in a *new* loader (new sampler and generator objects, a different
global RNG state, as in a new process): the batches after the resume point must equal the
reference's, pixels and targets, including the random crops.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

import torch.utils.data as tud
from torchvision import datasets
from torchvision import transforms as T

from fastload.torch import DataLoader, OrderSampler

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def ds(tiny_folder):
    return datasets.ImageFolder(
        str(tiny_folder),
        T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]),
    )


def run(loader, passes, stop=None):
    """``passes`` passes of (images, targets) clones; with ``stop=(p, k)``, the state after batch k of pass p."""
    out = []
    for p in range(passes):
        for k, (x, y) in enumerate(loader):
            out.append((x.clone(), y.clone()))
            if stop is not None and p == stop[0] and k == (stop[1] % len(loader)):
                return out, loader.state_dict()
    return out, None


def same(a, b):
    assert len(a) == len(b)
    for (x, y), (rx, ry) in zip(a, b, strict=False):
        assert torch.equal(y, ry) and torch.equal(x, rx)


def gen(seed):
    return torch.Generator().manual_seed(seed)


# Every source of randomness explicit (a generator, or seed= for the crops), so that whole passes
# after the resumed one are exact too; the global-RNG case is tested below.
MAKERS = {
    "generator": lambda ds: dict(shuffle=True, generator=gen(5)),
    "sampler_generator": lambda ds: dict(sampler=tud.RandomSampler(ds, generator=gen(6)), generator=gen(1)),
    "replacement": lambda ds: dict(
        sampler=tud.RandomSampler(ds, replacement=True, num_samples=30, generator=gen(2)), generator=gen(3)
    ),
    "weighted": lambda ds: dict(
        sampler=tud.WeightedRandomSampler([1.0 + i % 4 for i in range(len(ds))], 30, generator=gen(8)), seed=1
    ),
    "order": lambda ds: dict(sampler=OrderSampler(ds, shuffle="block", seed=4, block_size=8, window=2), seed=3),
    "sequential": lambda ds: dict(seed=9),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
@pytest.mark.parametrize("stop", [(0, 2), (1, 0), (0, -1)], ids=["mid-pass", "second-pass", "pass-end"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_exact_with_explicit_generators(ds, name, stop, num_workers):
    make = MAKERS[name]
    torch.manual_seed(0)
    reference, _ = run(DataLoader(ds, batch_size=8, num_workers=num_workers, **make(ds)), 3)
    torch.manual_seed(0)
    first = DataLoader(ds, batch_size=8, num_workers=num_workers, **make(ds))
    done, state = run(first, 3, stop)
    assert state is not None
    torch.manual_seed(12345)  # another process: another global RNG state
    second = DataLoader(ds, batch_size=8, num_workers=num_workers, **make(ds))
    second.load_state_dict(state)
    rest, _ = run(second, 3 - stop[0])
    n = len(first)
    assert len(done) == stop[0] * n + stop[1] % n + 1
    # The interrupted pass continues, then whole passes follow, as in the uninterrupted run.
    same(done + rest[: len(reference) - len(done)], reference)


@pytest.mark.parametrize("stop", [(0, 1), (1, 3)])
def test_resume_with_global_rng_finishes_the_pass_exactly(ds, stop):
    torch.manual_seed(0)
    reference, _ = run(DataLoader(ds, batch_size=8, shuffle=True), 2)
    torch.manual_seed(0)
    done, state = run(DataLoader(ds, batch_size=8, shuffle=True), 2, stop)
    torch.manual_seed(777)
    rng_before = torch.get_rng_state()
    second = DataLoader(ds, batch_size=8, shuffle=True)
    second.load_state_dict(state)
    rest = [(x.clone(), y.clone()) for x, y in second]
    same(done + rest, reference[: len(done) + len(rest)])
    assert len(done) + len(rest) == (stop[0] + 1) * len(second)
    # The replay set the saved RNG state for itself only; the resumed pass draws no new base seed.
    assert torch.equal(torch.get_rng_state(), rng_before)


def test_resume_distributed_sampler_with_set_epoch(ds):
    def make():
        s = tud.DistributedSampler(ds, num_replicas=2, rank=1, seed=3)
        return s, DataLoader(ds, batch_size=4, sampler=s, seed=5)  # crops keyed by the sampler's epoch

    s, loader = make()
    reference = []
    for epoch in range(3):
        s.set_epoch(epoch)
        reference += [(x.clone(), y.clone()) for x, y in loader]
    s, loader = make()
    done = []
    for epoch in range(2):
        s.set_epoch(epoch)
        for k, (x, y) in enumerate(loader):
            done.append((x.clone(), y.clone()))
            if epoch == 1 and k == 1:
                break
        if epoch == 1:
            state = loader.state_dict()
    s2, second = make()
    second.load_state_dict(state)
    assert s2.epoch == 1
    rest = [(x.clone(), y.clone()) for x, y in second]
    s2.set_epoch(2)
    rest += [(x.clone(), y.clone()) for x, y in second]
    same(done + rest, reference)


def test_seeded_augmentation_resumes_by_epoch(ds):
    torch.manual_seed(0)
    reference, _ = run(DataLoader(ds, batch_size=8, seed=11), 2)
    first = DataLoader(ds, batch_size=8, seed=11)
    done, state = run(first, 2, (1, 2))
    second = DataLoader(ds, batch_size=8, seed=11)
    second.load_state_dict(state)
    rest, _ = run(second, 1)
    same(done + rest, reference)
    assert not torch.equal(reference[0][0], reference[len(first)][0])  # epochs differ


def test_state_of_another_loader_is_refused(ds):
    state = DataLoader(ds, batch_size=8).state_dict()
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(ds, batch_size=4).load_state_dict(state)
    with pytest.raises(ValueError, match="not a fastload"):
        DataLoader(ds, batch_size=8).load_state_dict({"epoch": 1})


def test_state_dict_survives_torch_save(ds, tmp_path):
    loader = DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1))
    it = iter(loader)
    next(it)
    torch.save(loader.state_dict(), tmp_path / "s.pt")
    state = torch.load(tmp_path / "s.pt", weights_only=True)
    other = DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1))
    other.load_state_dict(state)
    assert len(list(other)) == len(other) - 1
