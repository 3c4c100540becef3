"""Where loading stands (seed, epoch, position), as every stage reports it: the plain
`FastLoadDataset`, `DeviceLoader(ds, "cpu")` and `DeviceStore(...).loader(ds)` on "cpu" answer
`set_epoch`, `state_dict` and `load_state_dict` alike, whichever of them (or the dataset under
a loader) is asked; a refused state changes nothing anywhere. A property test runs random
programs of those calls against a plain model of the plan, batch for batch."""

import numpy as np
import pytest
import torch
from dataset_helpers import N
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from fastload import Augment, DeviceLoader, FastLoadDataset, Store, to_device
from fastload.dataset.plan import epoch_order
from fastload.resident import DeviceStore

BATCH = 8
BATCHES = -(-N // BATCH)
SEED = 5
AUGMENT = Augment.from_spec("crop=0.5,flip,jitter", size=4, seed=1)
STAGES = ["dataset", "device_loader", "resident_loader"]
LOADERS = ["device_loader", "resident_loader"]


@pytest.fixture(scope="module")
def resident(store_path):
    """The conftest store (N records) on the "cpu" device."""
    return DeviceStore(store_path, "cpu", reserve_bytes=0, progress=False)


@pytest.fixture
def make(store_path, resident):
    """make(kind) -> (dataset, stage): the stage `kind` over a fresh dataset (the stage is the
    dataset itself for "dataset"); loaders augment, so their batches show the epoch drawn."""

    def make(kind, **options):
        ds = FastLoadDataset(store_path, BATCH, seed=SEED, return_indices=True, **options)
        if kind == "dataset":
            return ds, ds
        if kind == "device_loader":
            return ds, DeviceLoader(ds, "cpu", augment=AUGMENT)
        return ds, resident.loader(ds, augment=AUGMENT)

    return make


def take(stage, k):
    """The first k batches of the stage's next iteration, the iteration left open after them."""
    batches = iter(stage)
    return [next(batches) for _ in range(k)]


def expected_epoch(make, kind, epoch):
    """Every batch of epoch `epoch` from a fresh stage of `kind`, told the epoch."""
    _, stage = make(kind)
    stage.set_epoch(epoch)
    return list(stage)


def same_batches(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# The public state API as it is meant to be, on each stage.


@pytest.mark.parametrize("kind", STAGES)
def test_a_fresh_stage_stands_at_the_start_of_epoch_0(make, kind):
    _, stage = make(kind)
    assert stage.state_dict() == {"seed": SEED, "epoch": 0, "position": 0}


@pytest.mark.parametrize("kind", STAGES)
def test_each_batch_handed_out_counts_one_and_an_epoch_run_to_its_end_moves_on(make, kind):
    _, stage = make(kind)
    take(stage, 3)
    assert stage.state_dict() == {"seed": SEED, "epoch": 0, "position": 3}
    assert len(list(stage)) == BATCHES  # a new iteration starts the next epoch, whole
    assert stage.state_dict() == {"seed": SEED, "epoch": 2, "position": 0}


@pytest.mark.parametrize("kind", STAGES)
def test_set_epoch_starts_that_epoch_from_its_start(make, kind):
    _, stage = make(kind)
    take(stage, 2)
    stage.set_epoch(3)
    assert stage.state_dict() == {"seed": SEED, "epoch": 3, "position": 0}
    same_batches(list(stage), expected_epoch(make, kind, 3))
    assert stage.state_dict() == {"seed": SEED, "epoch": 4, "position": 0}


@pytest.mark.parametrize("kind", STAGES)
def test_a_state_resumes_exactly_on_fresh_objects(make, kind):
    _, stage = make(kind)
    stage.set_epoch(2)
    first = take(stage, 3)
    state = stage.state_dict()
    assert state == {"seed": SEED, "epoch": 2, "position": 3}
    _, fresh = make(kind)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    same_batches(first + list(fresh), expected_epoch(make, kind, 2))
    assert fresh.state_dict() == {"seed": SEED, "epoch": 3, "position": 0}


# One state for every stage: the dataset under a loader and the loader answer alike, whichever
# was told, and a loader's batches (order and augmentation draws) follow that one state.


@pytest.mark.parametrize("kind", LOADERS)
def test_set_epoch_on_the_dataset_is_the_epoch_a_loader_reports_and_draws_with(make, kind):
    ds, loader = make(kind)
    ds.set_epoch(3)
    first = take(loader, 2)
    assert loader.state_dict() == ds.state_dict() == {"seed": SEED, "epoch": 3, "position": 2}
    same_batches(first, expected_epoch(make, kind, 3)[:2])


@pytest.mark.parametrize("kind", LOADERS)
@pytest.mark.parametrize("told", ["dataset", "loader"])
def test_the_dataset_and_its_loader_answer_alike_whichever_is_told(make, kind, told):
    ds, loader = make(kind)
    target = ds if told == "dataset" else loader
    take(loader, 2)
    assert ds.state_dict() == loader.state_dict() == {"seed": SEED, "epoch": 0, "position": 2}
    loaded = {"seed": 9, "epoch": 4, "position": 1}
    target.load_state_dict(loaded)
    assert ds.state_dict() == loader.state_dict() == loaded
    _, reference = make(kind)
    reference.load_state_dict({**loaded, "position": 0})
    same_batches(list(loader), list(reference)[1:])
    target.set_epoch(6)
    assert ds.state_dict() == loader.state_dict() == {"seed": 9, "epoch": 6, "position": 0}


BAD_STATES = [
    {"seed": 999, "epoch": -1, "position": 0},
    {"seed": 999, "epoch": "1", "position": 0},
    {"seed": 999, "epoch": 1, "position": BATCHES + 1},
    {"seed": 999, "epoch": 1},
    {"seed": -1, "epoch": 1, "position": 0},
    {"seed": 999, "epoch": 1, "position": 0, "not_iterated_on_rank": 1},
]


@pytest.mark.parametrize("kind", STAGES)
@pytest.mark.parametrize("bad", BAD_STATES)
def test_a_refused_state_leaves_every_stage_as_it_was(make, kind, bad):
    """load_state_dict checks the whole state before it changes anything: after a refused one
    the stages report what they did and the next epoch is the one the old seed orders."""
    ds, stage = make(kind)
    stage.set_epoch(2)
    take(stage, 2)
    with pytest.raises(ValueError):
        stage.load_state_dict(bad)
    assert stage.state_dict() == ds.state_dict() == {"seed": SEED, "epoch": 2, "position": 2}
    same_batches(list(stage), expected_epoch(make, kind, 3))


# Random programs against a plain model of the plan.


class PlanModel:
    """What the stages should do, written plainly: the epoch order (`plan.epoch_order`, pinned
    by test_plan.py), each rank's batches cut from it as RankPlan documents them, and the
    bookkeeping of set_epoch, state_dict, load_state_dict and iterations."""

    def __init__(self, seed, order, rank, world_size, drop_last, block_size):
        self.seed, self.order, self.rank, self.world_size = seed, order, rank, world_size
        self.drop_last, self.block_size = drop_last, block_size
        self.next_epoch, self.resume, self.current = 0, None, None  # current: [epoch, position]

    def batches(self, epoch):
        """The record numbers of each batch this rank gets in `epoch`."""
        order = epoch_order(np.arange(N), self.order, self.seed, epoch, self.block_size, 8)
        b, w, r = BATCH, self.world_size, self.rank
        full, tail = (N // (w * b), 0) if self.drop_last else divmod(-(-N // w), b)
        padded = np.resize(order, w * (full * b + tail))
        cut = [padded[(k * w + r) * b : (k * w + r + 1) * b] for k in range(full)]
        return cut + ([padded[full * w * b + r * tail : full * w * b + (r + 1) * tail]] if tail else [])

    def state(self):
        if self.current is not None:
            epoch, position = self.current
        else:
            epoch = self.next_epoch
            position = self.resume[1] if self.resume and self.resume[0] == epoch else 0
        return {"seed": self.seed, "epoch": epoch, "position": position}

    def set_epoch(self, epoch):
        self.next_epoch, self.resume, self.current = epoch, None, None

    def load(self, state):
        self.seed, self.next_epoch = state["seed"], state["epoch"]
        self.resume, self.current = (state["epoch"], state["position"]), None

    def start(self):
        """The batches left of the iteration starting now, which claims its epoch."""
        epoch, position = self.state()["epoch"], self.state()["position"]
        self.next_epoch, self.current = epoch + 1, [epoch, position]
        return self.batches(epoch)[position:]


OPERATIONS = st.one_of(
    st.tuples(st.just("set_epoch"), st.sampled_from(["dataset", "stage"]), st.integers(0, 4)),
    st.tuples(st.just("iterate"), st.integers(1, 9)),
    st.tuples(st.just("reload"), st.sampled_from(["dataset", "stage"])),
)


@pytest.mark.parametrize("kind", STAGES)
@settings(max_examples=60, deadline=None)
@given(
    order=st.sampled_from(["random", "block", "sequential"]),
    world_size=st.integers(1, 2),
    data=st.data(),
    drop_last=st.booleans(),
    program=st.lists(OPERATIONS, max_size=12),
)
def test_random_programs_give_the_plans_batches_on_every_stage(
    store_path, resident, kind, order, world_size, data, drop_last, program
):
    """Each program (set_epoch on the dataset or the stage, iterate k batches, save the state
    and load it into fresh objects) gives the model's batches bit for bit, augmentation draws
    included, and after every step the stage and its dataset report the model's state."""
    rank = data.draw(st.integers(0, world_size - 1), label="rank")
    store = Store(store_path)
    options = dict(
        seed=SEED, order=order, shuffle=order != "sequential", rank=rank, world_size=world_size,
        drop_last=drop_last, block_size=4,
    )  # fmt: skip

    def fresh():
        ds = FastLoadDataset(store, BATCH, return_indices=True, **options)
        if kind == "dataset":
            return ds, ds
        if kind == "device_loader":
            return ds, DeviceLoader(ds, "cpu", augment=AUGMENT)
        return ds, resident.loader(ds, augment=AUGMENT)

    def expected(records, epoch):
        images, labels = (torch.from_numpy(a) for a in store.gather(records))
        if kind != "dataset":
            images = to_device(images, "cpu", augment=AUGMENT, keys=torch.from_numpy(records), epoch=epoch)
        return images, labels, torch.from_numpy(records)

    model = PlanModel(SEED, order, rank, world_size, drop_last, block_size=4)
    ds, stage = fresh()
    running, left = None, None  # the stage's open iteration and the model's batches left of it
    for operation in program:
        if operation[0] != "iterate" and running is not None:
            running.close()
            running = None
        if operation[0] == "set_epoch":
            (ds if operation[1] == "dataset" else stage).set_epoch(operation[2])
            model.set_epoch(operation[2])
        elif operation[0] == "reload":
            state = (ds if operation[1] == "dataset" else stage).state_dict()
            ds, stage = fresh()
            (ds if operation[1] == "dataset" else stage).load_state_dict(state)
            model.load(state)
        else:
            for _ in range(operation[1]):
                if running is None:
                    running, left = iter(stage), None
                batch = next(running, None)
                if left is None:
                    left = model.start()  # the stage claims its epoch on the first next()
                if not left:
                    assert batch is None
                    model.current, running = None, None
                    break
                epoch = model.current[0]
                want_batch = expected(left.pop(0), epoch)
                assert batch is not None and len(batch) == len(want_batch)
                for got, want in zip(batch, want_batch):
                    assert got.dtype == want.dtype and torch.equal(got, want)
                model.current[1] += 1
        assert stage.state_dict() == ds.state_dict() == model.state(), program
    if running is not None:
        running.close()


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata 0.11 on newer torch
def test_a_loader_over_a_stateful_dataloader_with_workers_resumes_exactly(store_path):
    """A DeviceLoader counts its batches in the main process's cursor; a DataLoader worker
    forked from it (after that count began) reports its own progress, so the state
    StatefulDataLoader saves per worker resumes exactly."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def loaders():
        ds = FastLoadDataset(store_path, BATCH, seed=SEED, return_indices=True)
        source = stateful.StatefulDataLoader(ds, batch_size=None, num_workers=1)
        return source, DeviceLoader(source, "cpu", augment=AUGMENT)

    _, uninterrupted = loaders()
    everything = [indices.tolist() for _, _, indices in uninterrupted]
    source, loader = loaders()
    batches = iter(loader)
    seen = [next(batches)[2].tolist() for _ in range(3)]
    state = source.state_dict()
    batches.close()
    source, loader = loaders()
    source.load_state_dict(state)
    assert seen + [indices.tolist() for _, _, indices in loader] == everything


def test_a_loader_left_mid_epoch_over_workers_does_not_stand_in_for_a_later_iteration(store_path):
    """A DeviceLoader over DataLoader workers, left mid-epoch, reports its count until another
    iteration starts; the dataset iterated directly afterwards reports its own progress."""
    ds = FastLoadDataset(store_path, BATCH, seed=SEED, return_indices=True)
    loader = DeviceLoader(DataLoader(ds, batch_size=None, num_workers=1), "cpu")
    batches = iter(loader)
    next(batches), next(batches)
    batches.close()
    assert ds.state_dict() == loader.state_dict() == {"seed": SEED, "epoch": 0, "position": 2}
    take(ds, 1)
    assert ds.state_dict() == loader.state_dict() == {"seed": SEED, "epoch": 1, "position": 1}
