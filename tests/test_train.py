"""The shared trainer's hooks: a fixed number of steps, batches of precomputed features, frozen layers."""

from __future__ import annotations

import numpy as np
import torch

from fedray.data import build_federated_data
from fedray.local import make_local_federation
from fedray.params import get_params
from fedray.train import feature_batches, local_train, sgd
from tests.conftest import small_config


def one_client(tmp_path, **over):
    cfg = small_config(tmp_path, batch_size=16, **over)
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    return fed.host.client(0)


def test_max_steps_stops_after_that_many_optimizer_steps(tmp_path):
    client = one_client(tmp_path, local_epochs=3)
    model = client.model(get_params(client.task.build_model()))
    stats = local_train(model, client, rnd=0, max_steps=3)
    assert stats.steps == 3 and stats.samples == 3 * 16
    full = local_train(model, client, rnd=0, epochs=1)
    assert full.steps == -(-client.num_examples // 16)  # last partial batch kept


def test_head_on_cached_features_follows_the_image_batches_of_a_frozen_encoder(tmp_path):
    client = one_client(tmp_path)
    init = get_params(client.task.build_model())
    # (a) the whole model, only the head in the optimizer (the encoder is frozen), images in
    a = client.model(init, slot="a")
    for p in a.encoder.parameters():
        p.requires_grad_(False)
    local_train(a, client, rnd=2, epochs=1, optimizer=sgd(a.head.parameters(), client), max_steps=3)
    # (b) features computed once, the head alone trained on them
    b = client.model(init, slot="b")
    with torch.no_grad():
        feats = np.concatenate([b.encoder(x).numpy() for x, _ in client.eval_train_batches()])
    labels = [y for _, y in feature_batches(client, feats, rnd=2)(0)]
    assert torch.equal(torch.cat(labels), torch.cat([y for _, y in client.train_batches(2, 0)]))
    head = b.head
    local_train(head, client, rnd=2, epochs=1, optimizer=sgd(head.parameters(), client),
                batches=feature_batches(client, feats, rnd=2), max_steps=3)  # fmt: skip
    assert torch.equal(a.encoder.fc1.weight, b.encoder.fc1.weight)  # frozen
    assert torch.allclose(a.head.weight, b.head.weight, atol=1e-6) and not torch.equal(
        a.head.weight, init_head(init)
    )


def init_head(params):
    return torch.from_numpy(params["head.weight"])


def _params_equal(a, b) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in a)


def test_per_sample_weights_scale_each_samples_gradient(tmp_path):
    # (1/|B|) sum w_b CE_b with w = 0.5 everywhere at lr is plain CE at lr / 2 (SGD without momentum
    # or weight decay; halving is exact in floating point), and w = 0 leaves the model unchanged
    client = one_client(tmp_path, momentum=0.0, weight_decay=0.0, lr=0.2)
    init = get_params(client.task.build_model())
    half = np.full(client.num_examples, 0.5)
    a = client.model(init, slot="a")
    local_train(a, client, rnd=0, epochs=1, weights=half)
    b = client.model(init, slot="b")
    local_train(b, client, rnd=0, epochs=1, optimizer=torch.optim.SGD(b.parameters(), lr=0.1))
    assert _params_equal(get_params(a), get_params(b))
    c = client.model(init, slot="c")
    stats = local_train(c, client, rnd=0, epochs=1, weights=np.zeros(client.num_examples))
    assert _params_equal(get_params(c), init) and stats.steps > 0
    # one sample's weight matters only where it sits: weights aligned with the training split
    w = np.ones(client.num_examples)
    w[0] = 0.0
    d = client.model(init, slot="d")
    local_train(d, client, rnd=0, epochs=1, weights=w)
    e = client.model(init, slot="e")
    local_train(e, client, rnd=0, epochs=1, weights=np.ones(client.num_examples))
    assert not _params_equal(get_params(d), get_params(e))


def test_drop_last_drops_the_partial_batch(tmp_path):
    client = one_client(tmp_path)
    model = client.model(get_params(client.task.build_model()))
    n = client.num_examples
    assert n % 16  # a partial last batch exists
    stats = local_train(model, client, rnd=0, epochs=1, drop_last=True)
    assert stats.steps == n // 16 and stats.samples == (n // 16) * 16


def test_optimizer_state_survives_as_arrays_between_rounds(tmp_path):
    from fedray.train import load_optimizer_state, optimizer_state

    client = one_client(tmp_path, momentum=0.9)
    init = get_params(client.task.build_model())
    # one optimizer kept across two rounds ...
    a = client.model(init, slot="a")
    opt = sgd(a.parameters(), client)
    local_train(a, client, rnd=0, epochs=1, optimizer=opt)
    local_train(a, client, rnd=1, epochs=1, optimizer=opt)
    # ... equals a fresh optimizer that gets the first one's buffers back as plain arrays
    b = client.model(init, slot="b")
    first = sgd(b.parameters(), client)
    local_train(b, client, rnd=0, epochs=1, optimizer=first)
    saved = optimizer_state(first, b)
    assert saved and all(isinstance(v, np.ndarray) for v in saved.values())
    assert "head.weight/momentum_buffer" in saved
    second = sgd(b.parameters(), client)
    load_optimizer_state(second, b, saved)
    local_train(b, client, rnd=1, epochs=1, optimizer=second)
    assert _params_equal(get_params(a), get_params(b))
    # without the buffers the second round differs (momentum restarts)
    c = client.model(init, slot="c")
    local_train(c, client, rnd=0, epochs=1)
    local_train(c, client, rnd=1, epochs=1)
    assert not _params_equal(get_params(a), get_params(c))
