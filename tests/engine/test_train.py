"""The per-client engine of a local-update description (fedray.engine.train.train_update): a cap on
steps, precomputed inputs, frozen parameters, sample weights, a correction after each step, kept
optimizer buffers."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from fedray.data import build_federated_data
from fedray.engine.train import feature_batches, optimizer_state, sgd, train_update
from fedray.engine.update import LocalUpdate
from fedray.experiment.local import make_local_federation
from fedray.models import Arch
from fedray.params import get_params
from tests.conftest import ROOT, small_config


def one_client(tmp_path, **over):
    cfg = small_config(tmp_path, batch_size=16, **over)
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    return fed.host.client(0)


def test_max_steps_stops_after_that_many_optimizer_steps(tmp_path):
    client = one_client(tmp_path, local_epochs=3)
    init = get_params(client.task.build_model())
    stats = train_update(client, LocalUpdate(init, 0, max_steps=3)).stats
    assert stats.steps == 3 and stats.samples == 3 * 16
    full = train_update(client, LocalUpdate(init, 0, epochs=1)).stats
    assert full.steps == -(-client.num_examples // 16)  # last partial batch kept


def test_head_on_cached_features_follows_the_image_batches_of_a_frozen_encoder(tmp_path):
    client = one_client(tmp_path)
    init = get_params(client.task.build_model())
    # (a) the whole model, only the head trains (the encoder is fixed), images in
    a = train_update(
        client, LocalUpdate(init, 2, trainable=["head.weight", "head.bias"], epochs=1, max_steps=3)
    )
    # (b) features computed once, the head alone trained on them
    model = client.model(init)
    with torch.no_grad():
        feats = np.concatenate([model.encoder(x).numpy() for x, _ in client.eval_train_batches()])
    labels = [y for _, y, _ in feature_batches(client, feats, rnd=2)(0)]
    assert torch.equal(torch.cat(labels), torch.cat([y for _, y in client.train_batches(2, 0)]))
    head = {"weight": init["head.weight"], "bias": init["head.bias"]}
    b = train_update(
        client, LocalUpdate(head, 2, arch=Arch(1, head_only=True), inputs=feats, epochs=1, max_steps=3)
    )
    assert all(np.array_equal(a.params[k], init[k]) for k in init if k.startswith("encoder."))  # fixed
    np.testing.assert_allclose(a.params["head.weight"], b.params["weight"], atol=1e-6)
    assert not np.array_equal(a.params["head.weight"], init["head.weight"])
    assert a.stats.steps == b.stats.steps == 3


def _params_equal(a, b) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in a)


def test_per_sample_weights_scale_each_samples_gradient(tmp_path):
    # (1/|B|) sum w_b CE_b with w = 0.5 everywhere at lr is plain CE at lr / 2 (SGD without momentum
    # or weight decay; halving is exact in floating point), and w = 0 leaves the model unchanged
    plain = dict(momentum=0.0, weight_decay=0.0)
    client = one_client(tmp_path / "a", lr=0.2, **plain)
    init = get_params(client.task.build_model())
    a = train_update(client, LocalUpdate(init, 0, epochs=1, weights=np.full(client.num_examples, 0.5)))
    b = train_update(one_client(tmp_path / "b", lr=0.1, **plain), LocalUpdate(init, 0, epochs=1))
    assert _params_equal(a.params, b.params)
    c = train_update(client, LocalUpdate(init, 0, epochs=1, weights=np.zeros(client.num_examples)))
    assert _params_equal(c.params, init) and c.stats.steps > 0
    # one sample's weight matters only where it sits: weights aligned with the training split
    w = np.ones(client.num_examples)
    w[0] = 0.0
    d = train_update(client, LocalUpdate(init, 0, epochs=1, weights=w))
    e = train_update(client, LocalUpdate(init, 0, epochs=1, weights=np.ones(client.num_examples)))
    assert not _params_equal(d.params, e.params)


def test_a_correction_moves_the_model_by_lr_times_it_after_every_step(tmp_path):
    # with every sample weighted 0 the gradient is 0, so K steps of SGD (no momentum, no weight
    # decay) with correction c move w to w - K lr c, worked out by hand in float32
    client = one_client(tmp_path, momentum=0.0, weight_decay=0.0, lr=0.25)
    init = get_params(client.task.build_model())
    c = {k: np.full(v.shape, 0.5, np.float32) for k, v in init.items()}
    got = train_update(
        client, LocalUpdate(init, 0, epochs=1, weights=np.zeros(client.num_examples), correction=c)
    )
    k = got.stats.steps
    assert k == -(-client.num_examples // 16)
    want = dict(init)
    for _ in range(k):  # each step subtracts lr * c = 0.125, exact in float32 steps
        want = {n: (v - np.float32(0.125)).astype(np.float32) for n, v in want.items()}
    assert _params_equal(got.params, want)


def test_drop_last_drops_the_partial_batch(tmp_path):
    client = one_client(tmp_path)
    n = client.num_examples
    assert n % 16  # a partial last batch exists
    stats = train_update(
        client, LocalUpdate(get_params(client.task.build_model()), 0, epochs=1, drop_last=True)
    ).stats
    assert stats.steps == n // 16 and stats.samples == (n // 16) * 16


def test_kept_buffers_continue_one_optimizer_across_rounds(tmp_path):
    client = one_client(tmp_path, momentum=0.9, weight_decay=1e-3)
    init = get_params(client.task.build_model())
    # one torch.optim.SGD kept across two rounds, by hand (the engine runs its rule, bit for bit) ...
    model = client.model(init, slot="by-hand")
    t = client.task
    opt = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    for rnd in (0, 1):
        for x, y in client.train_batches(rnd, 0):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    # ... equals two updates, the second going on from the first's buffers (plain arrays)
    first = train_update(client, LocalUpdate(init, 0, epochs=1, keep_buffers=True))
    assert first.buffers and all(isinstance(v, np.ndarray) for v in first.buffers.values())
    assert "head.weight/momentum_buffer" in first.buffers
    second = train_update(client, LocalUpdate(first.params, 1, epochs=1, buffers=first.buffers))
    assert _params_equal(get_params(model), second.params) and second.buffers is None
    # without the buffers the second round differs (momentum restarts)
    fresh = train_update(client, LocalUpdate(first.params, 1, epochs=1))
    assert not _params_equal(second.params, fresh.params)


def test_dropout_draws_do_not_depend_on_what_the_process_drew_before(tmp_path):
    # A model with dropout (MobileNetV2's classifier; VGG-16, LayerCFL's model, has two) trains to
    # the same parameters whatever torch's global generator went through before in this process:
    # the clients an actor ran before this one, the runs a sweep's actors served, a resume from a
    # checkpoint. So its numbers do not depend on the actor count or on being resumed.
    client = one_client(tmp_path, model="mobilenet_v2")
    init = get_params(client.task.build_model())
    update = LocalUpdate(init, 1, max_steps=2)
    first = train_update(client, update).params
    torch.rand(1000)  # what another client's training would have drawn
    before = torch.get_rng_state()
    again = train_update(client, update).params
    assert _params_equal(first, again)
    assert torch.equal(torch.get_rng_state(), before)  # and the process's generator is left as it was
    # the stream is the client's own, per round and per update of the call (a FedEM client's K
    # components draw independent masks)
    from fedray.engine.train import own_draws

    def drawn(c, rnd, draw=0):
        with own_draws(c, rnd, draw):
            return torch.rand(8)

    assert torch.equal(drawn(client, 1), drawn(client, 1))
    other = one_client(tmp_path / "b", model="mobilenet_v2")
    other.cid = client.cid + 1
    for a, b in [(drawn(client, 2), drawn(client, 1)), (drawn(client, 1, 1), drawn(client, 1))]:
        assert not torch.equal(a, b)
    assert not torch.equal(drawn(other, 1), drawn(client, 1))


def test_a_clients_updates_of_one_call_draw_their_own_dropout_masks(tmp_path):
    # FedEM's K components of one client, one round: the same start and batches, their own masks;
    # and the same again when the call is repeated
    from fedray.engine.drive import run_one

    client = one_client(tmp_path, model="mobilenet_v2")
    init = get_params(client.task.build_model())

    def components(client, cstate, msg):
        trained = yield [LocalUpdate(init, 1, max_steps=2), LocalUpdate(init, 1, max_steps=2)]
        return [t.params for t in trained], cstate

    (a, b), _ = run_one(components, client, None, None)
    assert not _params_equal(a, b)
    (a2, b2), _ = run_one(components, client, None, None)
    assert _params_equal(a, a2) and _params_equal(b, b2)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_the_engines_sgd_is_torch_optim_sgd_bit_for_bit(tmp_path, momentum):
    # parameters that train and one that does not (no gradient: skipped, as the optimizer skips it)
    client = one_client(tmp_path, momentum=momentum, weight_decay=5e-4, lr=0.07)
    init = get_params(client.task.build_model())
    mine, theirs = client.model(init, slot="mine"), client.model(init, slot="theirs")
    for m in (mine, theirs):
        m.head.bias.requires_grad_(False)
    t = client.task
    ours = sgd([p for p in mine.parameters() if p.requires_grad], client)
    ref = torch.optim.SGD(
        [p for p in theirs.parameters() if p.requires_grad],
        lr=t.lr,
        momentum=t.momentum,
        weight_decay=t.weight_decay,
    )
    for x, y in list(client.train_batches(0, 0)) * 2:
        for m, opt in ((mine, ours), (theirs, ref)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
    assert _params_equal(get_params(mine), get_params(theirs))
    kept, want = optimizer_state(ours, mine), optimizer_state(ref, theirs)
    assert kept.keys() == want.keys() and _params_equal(kept, want)
    assert bool(kept) == bool(momentum) and not any(k.startswith("head.bias") for k in kept)


def test_the_per_client_engine_does_not_import_torchdynamo(tmp_path):
    # torch.optim's optimizers import torch._dynamo at their first call: about a second in every
    # process that trains (each client actor, each command), which the per-client engine (the CPU's
    # default) does not pay. The stacked engine does: torch.func's gradients import it.
    code = (
        "import sys, tempfile; from pathlib import Path\n"
        "from fedray.experiment.loop import execute; from fedray.experiment.local import make_local_federation\n"
        "from tests.conftest import ROOT, small_config\n"
        "for extra in ({}, {'algorithm': 'fedrc', 'momentum': 0.9}):\n"
        "    list(execute(small_config(Path(tempfile.mkdtemp()), rounds=1, **extra), make_local_federation))\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "[]", p.stdout[-500:]
