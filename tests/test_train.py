"""The shared trainer's hooks: a fixed number of steps, batches of precomputed features, frozen layers."""

from __future__ import annotations

import numpy as np
import torch

from fedray.data import build_federated_data
from fedray.federation import make_local_federation
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
