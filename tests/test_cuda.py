"""Device stage (torch) on a GPU: pinned slots, per-device copies, fences, resume, a compiled model.

Most tests take a ``dev`` parameter and run twice: ``cpu`` in the normal suite (the same split,
copy, lease, resume and compile logic with CPU devices, so the bodies cannot rot on machines
without a GPU), and ``cuda`` where torch sees a GPU. Tests marked ``cuda`` exercise a CUDA path:
``pytest -m cuda`` selects them (``make device-check`` runs that on the GPU machine) and they are
skipped without CUDA, except the ones whose body compares with torch's own DataLoader on whatever
machine runs them. The two fence tests need a GPU to delay a copy (``torch.cuda._sleep``); their CPU
counterparts, with stand-in events, are in ``tests/test_lifetime.py``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

import torch.utils.data as tud
from torchvision import datasets
from torchvision import transforms as T

import fastload.batch
import fastload.torch.planning as fplan
from fastload.pack.packer import pack_folder
from fastload.torch import DataLoader, pinned_allocator
from fastload.transforms import CenterCrop, train

CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda:0", id="cuda", marks=[pytest.mark.cuda, requires_cuda]),
]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
EVAL = CenterCrop(size=32, resize=40)
# GPU cycles a copy is held back by (about 0.15 s at Hopper clocks): far longer than the host needs
# to decode the few small batches that follow, so a slot refilled too early is certain to be caught.
DELAY_CYCLES = 300_000_000


@pytest.fixture(scope="module")
def packed(tiny_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed") / "tiny"
    pack_folder(str(tiny_folder), str(out), workers=1, progress=False)
    return str(out)


@pytest.fixture(scope="module")
def reference(packed):
    """The host batches (uint8, in order) every device test compares against."""
    with DataLoader(packed, batch_size=8, transform=EVAL) as loader:
        return [(x.clone(), y.clone()) for x, y in loader]


def host(t):
    return t.detach().to("cpu")


def same_batches(got, ref):
    assert len(got) == len(ref)
    for (x, y), (rx, ry) in zip(got, ref, strict=True):
        assert torch.equal(host(y), ry)
        assert torch.equal(host(x), rx)


def slot_of(loader, tensor):
    """The ring slot whose image buffer holds ``tensor``'s memory, or None (a copy)."""
    ptr = tensor.data_ptr()
    for slot in loader.loader.ring.slots:
        owner = slot.owners["images"]
        if owner.data_ptr() <= ptr < owner.data_ptr() + owner.numel() * owner.element_size():
            return slot
    return None


# --- pinned ring slots ------------------------------------------------------------------------


@pytest.mark.parametrize("dev", DEVICES)
def test_pinned_allocator(dev):
    pin = dev != "cpu"
    view, owner = pinned_allocator((4, 3, 8, 8), np.dtype(np.uint8), pin=pin)
    assert owner.is_pinned() == pin
    view[...] = 7
    assert int(owner.sum()) == 7 * view.size  # the numpy view is the tensor's memory


@pytest.mark.parametrize("dev", DEVICES)
def test_ring_slots_are_pinned_and_batches_are_views_of_them(packed, reference, dev):
    pin = dev != "cpu"
    with DataLoader(packed, batch_size=8, transform=EVAL, pin_memory=pin, prefetch=1) as loader:
        got = []
        for x, y in loader:
            assert x.is_pinned() == pin
            slot = slot_of(loader, x)
            assert slot is not None, "a batch must be a zero-copy view of its ring slot"
            assert slot.owners["images"].is_pinned() == pin
            got.append((x.clone(), y.clone()))
        assert all(s.owners["images"].is_pinned() == pin for s in loader.loader.ring.slots)
    same_batches(got, reference)


@pytest.mark.cuda
def test_pin_memory_and_pin_memory_device_as_torch(tiny_folder):
    """Same warnings, same pinned outputs as torch's DataLoader, with or without a GPU."""
    ds = datasets.ImageFolder(str(tiny_folder), T.Compose([T.Resize(40), T.CenterCrop(32), T.PILToTensor()]))
    for kwargs in (dict(pin_memory=True), dict(pin_memory=True, pin_memory_device="cuda")):
        seen = []
        for cls in (DataLoader, tud.DataLoader):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                x, y = next(iter(cls(ds, batch_size=8, **kwargs)))
            messages = sorted(str(w.message) for w in caught if "pin_memory" in str(w.message))
            seen.append((messages, x.is_pinned(), y.is_pinned(), x.clone(), y.clone()))
        ours, theirs = seen
        assert ours[:3] == theirs[:3], kwargs
        # Pixels as torchvision's to within a few grey levels (tests/test_torch.py checks them closely).
        assert (ours[3].float() - theirs[3].float()).abs().mean() < 3.0 and torch.equal(ours[4], theirs[4])
        assert ours[1] == torch.cuda.is_available()


# --- per-device copies ------------------------------------------------------------------------


@pytest.mark.parametrize("dev", DEVICES)
def test_device_copies_equal_the_host_batches(packed, reference, dev):
    device = torch.device(dev)
    with DataLoader(packed, batch_size=8, transform=EVAL, device=dev, prefetch=1) as loader:
        it = iter(loader)
        if device.type == "cuda":
            stream = it._placement._streams[device]
            assert stream != torch.cuda.current_stream(device)  # copies run on a stream of their own
        got = []
        for x, y in it:
            assert x.device == device and y.device == device
            # Used at once on the consumer's stream, which waits for the copy stream: no race.
            assert int(x.sum(dtype=torch.int64)) == int(reference[len(got)][0].sum(dtype=torch.int64))
            got.append((x, y))
    same_batches(got, reference)


@pytest.mark.parametrize("dev", DEVICES)
def test_normalized_channels_last_on_the_device(packed, reference, dev):
    with DataLoader(
        packed, batch_size=8, transform=EVAL, device=dev, channels_last=True, normalize=(MEAN, STD), dtype=torch.float16
    ) as loader:
        got = [(x, y) for x, y in loader]
    mean = torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    for (x, y), (rx, ry) in zip(got, reference, strict=True):
        assert x.dtype == torch.float16 and x.device == torch.device(dev)
        assert x.is_contiguous(memory_format=torch.channels_last)
        expected = (rx.double() / 255 - mean) / std
        torch.testing.assert_close(host(x).double(), expected, atol=2e-2, rtol=1e-2)
        assert torch.equal(host(y), ry)


@pytest.mark.parametrize("dev", DEVICES)
def test_device_lists_on_one_gpu(packed, reference, dev):
    """``devices=``: a list of one, a GPU beside the CPU, and two iterators on the same GPU."""
    with DataLoader(packed, batch_size=8, transform=EVAL, devices=[dev]) as one:
        got = []
        for parts in one:
            assert isinstance(parts, list) and len(parts) == 1
            got.append(tuple(parts[0]))
    same_batches(got, reference)

    with DataLoader(packed, batch_size=8, transform=EVAL, devices=[dev, "cpu"]) as mixed:
        got = []
        for parts in mixed:
            assert [p[0].device for p in parts] == [torch.device(dev), torch.device("cpu")]
            assert [p[0].shape[0] for p in parts] == [4, 4]
            got.append((torch.cat([host(p[0]) for p in parts]), torch.cat([host(p[1]) for p in parts])))
    same_batches(got, reference)

    # Two loaders feeding the same GPU (two models, or two consumers of one process), interleaved.
    with (
        DataLoader(packed, batch_size=8, transform=EVAL, devices=[dev], prefetch=1) as a,
        DataLoader(packed, batch_size=8, transform=EVAL, devices=[dev], prefetch=1) as b,
    ):
        ita, itb = iter(a), iter(b)
        if torch.device(dev).type == "cuda":
            assert ita._placement._streams[torch.device(dev)] != itb._placement._streams[torch.device(dev)]
        got_a, got_b = [], []
        for pa, pb in zip(ita, itb, strict=True):
            got_a.append(tuple(pa[0]))
            got_b.append(tuple(pb[0]))
    same_batches(got_a, reference)
    same_batches(got_b, reference)


# --- fences: a slot is not refilled while a copy still reads it ------------------------------


def _delayed_device_copies(packed, n_ref):
    """Batches copied by ``device=``, each copy held back on the GPU behind a sleep on its stream.

    The ring is pinned, so each copy is a true asynchronous DMA that reads the slot when the GPU
    reaches it (from pageable memory the driver would first copy the bytes into its own pinned buffer).
    """
    with DataLoader(packed, batch_size=8, transform=EVAL, device="cuda:0", prefetch=1, pin_memory=True) as loader:
        it = iter(loader)
        stream = it._placement._streams[torch.device("cuda:0")]
        got = []
        for _ in range(n_ref):
            with torch.cuda.stream(stream):
                torch.cuda._sleep(DELAY_CYCLES)  # the next copy on this stream starts after it
            got.append(next(it))
        torch.cuda.synchronize()
    return got


@pytest.mark.cuda
@requires_cuda
def test_device_copy_fences_keep_slots_until_the_copy_ran(packed, reference, monkeypatch):
    # The host batch dies as soon as next() returns, while its copy still waits on the GPU: only the
    # CUDA event the placement attaches to the slot keeps the ring from refilling it under the copy.
    # (The release hook's event, recorded on the consumer's stream, which waits for the copy stream,
    # would guard it too: it is switched off here so that the placement's own fence is what is tested.)
    monkeypatch.setattr(fplan, "cuda_release_fences", list)
    same_batches(_delayed_device_copies(packed, len(reference)), reference)
    # Control: without the fence the same run reads refilled slots (so the check above has teeth).
    monkeypatch.setattr(fastload.batch.Batch, "add_fence", lambda self, fence: None)
    got = _delayed_device_copies(packed, len(reference))
    assert any(not torch.equal(host(x), rx) for (x, _), (rx, _) in zip(got, reference, strict=True))


def _kept_user_copies(packed):
    """The user's own non_blocking copies out of pinned batches, each held back behind a sleep."""
    got = []
    with DataLoader(packed, batch_size=8, transform=EVAL, pin_memory=True, prefetch=1) as loader:
        for x, y in loader:
            torch.cuda._sleep(DELAY_CYCLES)  # on the current stream, before the copy
            got.append((x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)))
            del x, y  # the batch dies with its copy still queued: the release hook's event fences it
        torch.cuda.synchronize()
    return got


@pytest.mark.cuda
@requires_cuda
def test_user_copies_of_pinned_batches_stay_intact(packed, reference, monkeypatch):
    torch.cuda.init()
    same_batches(_kept_user_copies(packed), reference)
    monkeypatch.setattr(fplan, "cuda_release_fences", list)  # no events: no fences
    got = _kept_user_copies(packed)
    assert any(not torch.equal(host(x), rx) for (x, _), (rx, _) in zip(got, reference, strict=True))


@pytest.mark.parametrize("dev", DEVICES)
def test_kept_device_batches_stay_intact(packed, reference, dev):
    """``list(loader)`` with device copies (asynchronous from a pinned ring): every batch intact."""
    pin = dev != "cpu"
    with DataLoader(packed, batch_size=8, transform=EVAL, device=dev, prefetch=1, pin_memory=pin) as loader:
        for _ in range(2):
            same_batches(list(loader), reference)


# --- resume -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dev", DEVICES)
def test_resume_on_the_device(packed, dev):
    def make():
        return DataLoader(
            packed,
            batch_size=8,
            shuffle=True,
            generator=torch.Generator().manual_seed(5),
            transform=train(24),
            seed=3,
            device=dev,
        )

    with make() as loader:
        full = [(host(x), host(y)) for _ in range(2) for x, y in loader]
    with make() as loader:
        head = []
        for x, y in loader:
            head.append((host(x), host(y)))
            if len(head) == 3:
                state = loader.state_dict()
                break
    torch.manual_seed(1234)  # a different global RNG, as in a new process
    with make() as loader:
        loader.load_state_dict(state)
        tail = [(host(x), host(y)) for x, y in loader]
        tail += [(host(x), host(y)) for x, y in loader]
    assert len(head) + len(tail) == len(full)
    same_batches(head + tail, full)


# --- a compiled model consuming the batches -----------------------------------------------------


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(16, 3),
        )

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("dev", DEVICES)
def test_compiled_model_consumes_device_batches(packed, dev):
    # inductor on the GPU; on the CPU "aot_eager" (graph capture and autograd tracing without code
    # generation) keeps the normal suite fast on small machines.
    backend = "inductor" if dev.startswith("cuda") else "aot_eager"
    torch.manual_seed(0)
    model = _Net().to(dev, memory_format=torch.channels_last)
    compiled = torch.compile(model, backend=backend)
    with DataLoader(
        packed,
        batch_size=8,
        transform=train(32),
        seed=0,
        device=dev,
        channels_last=True,
        normalize=(MEAN, STD),
        drop_last=True,
        shuffle=True,
    ) as loader:
        steps = 0
        for x, y in loader:
            model.eval()
            with torch.no_grad():
                expected = model(x)
                out = compiled(x)
            torch.testing.assert_close(out, expected, atol=1e-3, rtol=1e-3)
            model.train()
            loss = torch.nn.functional.cross_entropy(compiled(x), y)
            loss.backward()
            assert torch.isfinite(loss)
            assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
            model.zero_grad(set_to_none=True)
            steps += 1
    assert steps == 5
