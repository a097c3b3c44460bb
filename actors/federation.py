"""RayFederation: the Federation protocol over client actors in a placement group."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import ray

from actors.launch import ActorGroup, launch_actors
from fedray.config.keys import Config
from fedray.config.plugins import PluginError
from fedray.data import FederatedData
from fedray.experiment.local import task_for
from fedray.federation import Baton, ClientError, ClientFn, FoldFn, WorkerLost
from fedray.federation.catalog import ClientCatalog, check_groups
from fedray.federation.host import ClientHost, clients_a_call, test_shards
from fedray.federation.placement import assign_clients
from fedray.params import payload_nbytes

# What a lost client actor (or its node) looks like to the caller: the run can go on from its last
# checkpoint on new actors. ObjectLostError covers values that lived in a lost node's object store.
LOST = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.NodeDiedError)
PLUGIN_FAILED = (
    "fedray.config.plugins.PluginError: "  # how an actor's failed plug-in import reads in Ray's error
)
_STATE_WINDOW = 4  # client states in flight at once when a checkpoint is saved or restored


def unwrap(error: BaseException) -> BaseException:
    """The user-facing exception inside Ray's wrappers: a ClientError keeps its client id."""
    seen = 0
    while isinstance(error, ray.exceptions.RayTaskError) and error.cause is not None and seen < 10:
        error, seen = error.cause, seen + 1
    return error


def _first_failure(refs: Any, first: ray.exceptions.RayTaskError) -> BaseException:
    """The failure of a call to several actors that names the lowest client: every other ref of the
    call is waited for and read too, so no actor's failure is left for Ray to print as an "Unhandled
    error", and the client named is the one the in-process run names (it runs clients in order and
    stops at the first that fails)."""
    if not isinstance(refs, list):
        return first
    failures: list[BaseException] = []
    for ref in refs:
        try:
            ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            failures.append(e)
        except Exception:  # noqa: BLE001 - a lost actor: `first` is what this call reports
            continue
    clients = [e for e in failures if isinstance(unwrap(e), ClientError)]
    return min(clients, key=lambda e: unwrap(e).cid) if clients else first


class _EveryNth:
    """Which actor hosts a client when actor a hosts every n-th client of ``ids`` from the a-th."""

    def __init__(self, actors: Sequence[Any], ids: range) -> None:
        self._actors, self._ids = list(actors), ids

    def __getitem__(self, cid: int) -> Any:
        if cid not in self._ids:
            raise KeyError(cid)
        return self._actors[self._ids.index(cid) % len(self._actors)]


class RayFederation(ClientCatalog):
    """The Federation protocol over an `ActorGroup` of client actors."""

    def __init__(self, cfg: Config, data: FederatedData, group: ActorGroup | None = None) -> None:
        self.task = task_for(cfg, data.dataset.spec)
        # Metadata (sizes, label counts) comes from a host that never trains; it reads the same arrays.
        super().__init__(
            ClientHost(self.task, data.dataset.train, data.clients),
            data.groups,
            data.test_clients,
            data.eval_clients,
        )
        self._test_size = len(data.dataset.test)
        self._own_group = group is None  # a group given to it is its caller's to close (or reuse)
        self._group = group or launch_actors(cfg.to_dict())
        self._group.wait_ready()
        self.actors = self._group.actors
        # Each array goes into the object store once; every actor reads it zero-copy.
        train_ref, test_ref = ray.put(data.dataset.train), ray.put(data.dataset.test)
        if data.sourced:
            # Clients made on demand: actor a hosts every A-th client from a (a range: nothing is
            # sent or kept per client, whatever their number), and makes each one when it is used.
            n = len(self.actors)
            shares = [data.clients.part(data.clients.ids[a::n]) for a in range(n)]
            self._actor_of: Any = _EveryNth(self.actors, data.clients.ids)
        else:
            sizes = dict(zip(self._hosted_ids.tolist(), self._hosted_train.tolist(), strict=True))
            groups = assign_clients(sizes, len(self.actors))  # test clients are hosted too
            shares = [{c: data.clients[c] for c in g} for g in groups]
            self._actor_of = {c: a for a, g in zip(self.actors, groups, strict=True) for c in g}
        setups = [
            a.setup.remote(self.task, train_ref, test_ref, share)
            for a, share in zip(self.actors, shares, strict=True)
        ]
        self.actor_info = self._get(setups)
        # each actor's replies at a time in a folded round (`fedray.federation.host.fold_bytes`)
        self.fold_bytes = {a: i["fold_bytes"] for a, i in zip(self.actors, self.actor_info, strict=True)}

    # --- plumbing ------------------------------------------------------------------------------
    def _get(self, refs: Any) -> Any:
        try:
            return ray.get(refs)
        except ray.exceptions.RayTaskError as e:
            inner = unwrap(_first_failure(refs, e))
            if isinstance(inner, ClientError):
                raise ClientError(inner.cid, inner.message, inner.remote_traceback, inner.mistake) from None
            raise
        except LOST as e:
            text = str(e)
            if PLUGIN_FAILED in text:  # a plug-in that does not import there: no new actor would do better
                raise PluginError(text.split(PLUGIN_FAILED, 1)[1].splitlines()[0]) from None
            raise WorkerLost(f"a client actor died (node lost, out of memory or killed): {e}") from None

    def placement(self) -> dict[str, Any]:
        return {
            "mode": "ray",
            "actors": len(self.actors),
            "nodes": len({i["node_id"] for i in self.actor_info}),
            "devices": sorted({i["device"] for i in self.actor_info}),
            "torch_threads": self.actor_info[0]["torch_threads"],
            "clients_per_actor": [len(i["clients"]) for i in self.actor_info],
            "actor_pids": sorted(i["pid"] for i in self.actor_info),  # actors a sweep reused keep theirs
        }

    # --- Federation protocol ---------------------------------------------------------------------
    def map(self, fn: ClientFn, cids: Sequence[int], msg: Any) -> dict[int, Any]:
        return self.map_groups(fn, [(cids, msg)])

    def map_groups(self, fn: ClientFn, groups: Sequence[tuple[Sequence[int], Any]]) -> dict[int, Any]:
        check_groups(groups)
        by_actor: dict[Any, list[tuple[list[int], Any]]] = {}
        for cids, msg in groups:
            msg_ref = ray.put(msg)  # each message goes into the object store once
            parts: dict[Any, list[int]] = {}
            for c in sorted(cids):
                parts.setdefault(self._actor_of[c], []).append(c)
            for a, part in parts.items():
                by_actor.setdefault(a, []).append((part, msg_ref))
            self._traffic.broadcast(msg, len(cids))
        # One call per actor with its share of every group: all groups run at once, and an actor
        # that trains batched stacks them all (fedray/engine/batched.py).
        refs = [a.run_groups.remote(fn, parts) for a, parts in by_actor.items()]
        results = [r for batch in self._get(refs) for r in batch]
        self._traffic.replies([m for _, m in results])
        return {m.cid: r for r, m in sorted(results, key=lambda rm: rm[1].cid)}

    def map_fold(
        self,
        fn: ClientFn,
        cids: Sequence[int],
        msg: Any,
        fold: FoldFn,
        acc: Any,
        chunk: int = 1,
        reply_bytes: int = 0,
    ) -> Any:
        msg_ref = ray.put(msg)
        cids = sorted(cids)
        # Each actor's clients in calls of ``chunk`` (or as many as its replies at a time hold, by
        # ``reply_bytes``: each actor its own, as its device allows), all submitted at once (an actor
        # runs its calls in order); the replies are fetched and folded in client order, a call's
        # replies released once all of them are folded.
        mine: dict[Any, list[int]] = {}
        for c in cids:
            mine.setdefault(self._actor_of[c], []).append(c)
        calls, call_of = [], {}
        for a, part in mine.items():
            step = clients_a_call(self.fold_bytes[a], reply_bytes, chunk)
            for start in range(0, len(part), step):
                group = part[start : start + step]
                call_of.update(dict.fromkeys(group, len(calls)))
                calls.append(a.run_groups.remote(fn, [(group, msg_ref)]))
        self._traffic.broadcast(msg, len(cids))
        got: dict[int, dict[int, Any]] = {}
        for cid in cids:
            i = call_of[cid]
            if i not in got:
                try:
                    replies = self._get(calls[i])
                except ClientError:  # every call read, the lowest failing client named (`_get`)
                    self._get([c for c in calls if c is not None])
                    raise
                got[i] = {m.cid: (r, m) for r, m in replies}
                calls[i] = None  # drop our ref: Ray frees the replies once nothing holds them
            reply, meta = got[i].pop(cid)
            if not got[i]:
                del got[i]
            self._traffic.replies([meta])
            acc = fold(acc, cid, reply)
            del reply
        return acc

    def relay(self, fn: ClientFn, hops: Sequence[tuple[int, Any]], common: Any) -> list[tuple[Baton, Any]]:
        common_ref = ray.put(common)
        put: dict[int, tuple[Any, int]] = {}  # a value given for several hops goes into the store once
        args, sizes = [], []
        for _, carry in hops:
            if isinstance(carry, Baton):
                arg, size = self._batons.take(carry)  # an ObjectRef: Ray hands its value actor to actor
            else:
                if id(carry) not in put:
                    put[id(carry)] = (ray.put(carry), payload_nbytes(carry))
                arg, size = put[id(carry)]
            args.append(arg)
            sizes.append(size)
        # one call per actor with its hops (trained together where it trains batched), in hop order
        by_actor: dict[Any, list[int]] = {}
        for h, (cid, _) in enumerate(hops):
            by_actor.setdefault(self._actor_of[cid], []).append(h)
        carries: list[Any] = [None] * len(hops)
        infos: list[Any] = [None] * len(hops)
        metas: list[Any] = [None] * len(hops)
        for actor, mine in by_actor.items():
            k = len(mine)
            refs = actor.relay.options(num_returns=3 * k).remote(
                fn, [hops[h][0] for h in mine], common_ref, *[args[h] for h in mine]
            )
            for j, h in enumerate(mine):
                carries[h], infos[h], metas[h] = refs[j], refs[k + j], refs[2 * k + j]
        got = self._get(infos + metas)  # the carries are never fetched here
        infos, metas = got[: len(hops)], got[len(hops) :]
        self._traffic.relay_hops(sizes, common, infos, metas)
        return [
            (self._batons.park(c, m.carry_bytes), i) for c, i, m in zip(carries, infos, metas, strict=True)
        ]

    def fetch(self, batons: Sequence[Baton]) -> list[Any]:
        taken = [self._batons.take(b) for b in batons]
        values = self._get([ref for ref, _ in taken])
        self._traffic.fetched([n for _, n in taken])
        return values

    def test_map(self, fn: ClientFn, msg: Any) -> list[Any]:
        msg_ref = ray.put(msg)
        shards = test_shards(self._test_size, self.task.eval_batch_size, len(self.actors))
        refs = [
            a.run_test.remote(fn, lo, hi, msg_ref) for a, (lo, hi) in zip(self.actors, shards, strict=False)
        ]
        return [r for part in self._get(refs) for r in part]

    def client_states(self, files: bool = False) -> Iterator[tuple[int, Any]]:
        # The clients that hold state (a million clients of which a few thousand have trained: only
        # those), a few at a time, in client order: a checkpoint never holds every state at once.
        cids = sorted(c for ids in self._get([a.stateful_ids.remote() for a in self.actors]) for c in ids)
        # spilled files on this node: linked
        node = ray.get_runtime_context().get_node_id() if files else None
        refs = {c: self._actor_of[c].get_state.remote(c, node) for c in cids[:_STATE_WINDOW]}
        for i, cid in enumerate(cids):
            if i + _STATE_WINDOW < len(cids):
                nxt = cids[i + _STATE_WINDOW]
                refs[nxt] = self._actor_of[nxt].get_state.remote(nxt, node)
            yield cid, self._get(refs.pop(cid))

    def restore_client_states(self, states: Iterable[tuple[int, Any]]) -> None:
        pending: list[Any] = []
        for cid, state in states:
            pending.append(self._actor_of[cid].set_state.remote(cid, state))
            if len(pending) >= _STATE_WINDOW:
                self._get(pending.pop(0))
        self._get(pending)

    def peek_baton(self, baton: Baton) -> Any:
        return self._get(self._batons.peek(baton)[0])

    def restore_baton(self, key: int, value: Any) -> Baton:
        return self._batons.restore(key, ray.put(value), payload_nbytes(value))

    def close(self) -> None:
        if self._own_group:
            self._group.close()
        self.actors = []


def make_ray_federation(
    cfg: Config, data: FederatedData, group: ActorGroup | None = None
) -> tuple[RayFederation, dict[str, Any]]:
    fed = RayFederation(cfg, data, group)
    return fed, fed.placement()
