"""Driver side: connect to (or start) Ray, start a run's actors and coordinator, stream its events."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.coordinator import Coordinator
from actors.federation import unwrap
from actors.launch import ActorGroup, ActorPool, launch_actors
from fedray.config.keys import Config, ConfigError
from fedray.config.plugins import PluginError, py_modules
from fedray.experiment.loop import Event, Recovered, RoundDone, Started
from fedray.federation import WorkerLost
from fedray.federation.placement import PlacementError, actor_slots, auto_gpus_per_actor, unused_gpus
from fedray.storage.results import failure_text
from fedray.storage.writer import mark_ended, record_failure

CONNECT_TIMEOUT_S = 10.0  # how long an address may take to answer before we say it cannot be reached


def _answers(address: str, timeout_s: float | None = None) -> bool:
    """Whether the Ray head at ``address`` (host:port of its GCS; ray://... is Ray Client's) accepts
    a connection within ``timeout_s`` (Ray's own connect retries for minutes)."""
    import socket
    import time

    timeout_s = CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return True  # not host:port: let Ray say what it makes of it
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=min(2.0, timeout_s)):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)


def _running_cluster() -> str | None:
    """The address of the Ray cluster `ray start` left running on this machine, if any (what a
    plain ``ray.init()`` joins)."""
    try:
        from ray._private.utils import read_ray_address

        return read_ray_address() or None
    except Exception:  # noqa: BLE001 - no such file, or a Ray without the helper: none
        return None


def connect(
    address: str | None = None, plugins: Sequence[str] = (), say: Callable[[str], None] | None = None
) -> bool:
    """Attach to ``address`` / RAY_ADDRESS, or to the cluster `ray start` runs on this machine, or
    start a local Ray (``address="local"`` always does). Returns True if we started it. An address
    that does not answer within `CONNECT_TIMEOUT_S` is an error naming it (a stale cluster found on
    this machine is passed over for a local Ray, with a warning), not minutes of Ray's retries.

    The job's workers (the coordinator, the client actors) run at normal priority and the
    plug-ins' files and packages go with the job to every node (`job_runtime_env`); with a Ray
    already initialised in this process the caller's ``ray.init`` decides both. ``say`` is told
    at once that a local Ray starts (on a busy machine that takes most of a minute), and then how
    long it took."""
    if ray.is_initialized():
        return False
    given = address or os.environ.get("RAY_ADDRESS") or None
    if given and given not in ("local", "auto") and not _answers(given):
        source = "--address" if address else "RAY_ADDRESS"
        raise ConnectionError(
            f"cannot reach the Ray cluster at {given} ({source}) within {CONNECT_TIMEOUT_S:g} s: is it running "
            "(`ray status`)? To run on a Ray of its own on this machine instead: --address local"
            + (" (or unset RAY_ADDRESS)" if source == "RAY_ADDRESS" else "")
        )
    if not given and (found := _running_cluster()):
        if _answers(found):
            # the cluster `ray start` runs here: attach (and say so by returning False) as a plain
            # ray.init() does, by "auto": Ray then reads how the cluster authenticates from this
            # machine (its token, as `ray start` enables by default); by the address itself it
            # sends no token unless RAY_AUTH_MODE says so, and the cluster refuses it
            given = "auto"
        else:
            logging.getLogger("fedray").warning(
                "a Ray cluster recorded on this machine (%s) does not answer: starting a local Ray instead "
                "(`ray stop` clears the record)",
                found,
            )
            given = "local"
    address = given if given != "local" else None
    fresh = given == "local"
    env = {"runtime_env": job_runtime_env(plugins)}
    # ray.init replaces the driver's SIGTERM handler with one that exits at once (status 15, no
    # cleanup); keep the caller's (the CLI's stops the run as Ctrl-C does).
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    try:
        if address:
            try:
                with _replacing_job_fields(env["runtime_env"]):
                    ray.init(address=address, logging_level=logging.WARNING, **env)
            except ConnectionError as e:
                if address == "auto":
                    raise
                # it answered (`_answers`), then refused: most often a token this process did not send
                raise ConnectionError(
                    f"{e}: it answers but refused this process. A cluster with token authentication (what "
                    "`ray start` sets up by default) needs RAY_AUTH_MODE=token here, and its token in "
                    "~/.ray/auth_token or RAY_AUTH_TOKEN (docs/cluster.md); a cluster `ray start` runs on "
                    "this machine is joined without an address"
                ) from e
            return False
        notice = logging.getLogger("ray._private.authentication.authentication_token_setup")
        notice.addFilter(_token_on_notice)
        if say is not None:
            say(
                f"starting a local Ray with this machine's {os.cpu_count()} CPUs (no cluster to attach to) ..."
            )
        t0 = time.perf_counter()
        try:
            with _replacing_job_fields(env["runtime_env"]), _loopback_only():
                ray.init(
                    address="local" if fresh else None, logging_level=logging.WARNING, **PRIVATE_RAY, **env
                )
        finally:
            notice.removeFilter(_token_on_notice)
        if say is not None:
            say(f"local Ray started in {time.perf_counter() - t0:.1f} s")
        _owner_only(Path.home() / ".ray" / "auth_token")
        return True
    finally:
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)


# Ray starts its workers at niceness 15, so that they never slow its own processes. fedray's workers
# are the job's whole work: at 15, any other busy process on a node leaves them a few percent of a
# core (docs/benchmark.md#figures-behind-defaults). Ray's own job supervisor runs at 0 the same way
# (the variable in its runtime_env).
WORKER_NICENESS = {"RAY_worker_niceness": "0"}


def job_runtime_env(plugins: Sequence[str] = ()) -> dict[str, Any]:
    """The runtime_env fedray's job connects with: its workers at normal priority (where the
    submitted job's runtime_env has the niceness already, as Ray's job manager gives it where the
    job asks for entrypoint resources, it stands: ray.init refuses the two as a conflict), and the
    plug-ins' files and packages for every node (``py_modules``)."""
    submitted = submitted_runtime_env()
    given = submitted.get("env_vars") or {}
    env: dict[str, Any] = {"env_vars": {k: v for k, v in WORKER_NICENESS.items() if k not in given}}
    if not env["env_vars"]:
        del env["env_vars"]
    if shipped := py_modules(plugins):
        # The job's own py_modules (`ray job submit --runtime-env-json`) stay beside the plug-ins:
        # ray.init can only replace the whole field (`connect` lets it), so it gets both.
        env["py_modules"] = [*(submitted.get("py_modules") or []), *shipped]
    return env


def submitted_runtime_env() -> dict[str, Any]:
    """The runtime_env of the job this process is the entry point of (``ray job submit``); {} when
    it is not a submitted job."""
    return json.loads(os.environ.get(RAY_JOB_CONFIG_JSON_ENV_VAR) or "{}").get("runtime_env") or {}


# what tells ray.init to let its runtime_env replace the submitted job's fields (Ray's own name)
OVERRIDE_JOB_RUNTIME_ENV = "RAY_OVERRIDE_JOB_RUNTIME_ENV"


@contextmanager
def _replacing_job_fields(env: dict[str, Any]) -> Iterator[None]:
    """Let ``ray.init`` replace fields the submitted job set too (Ray refuses the pair otherwise,
    even where, as with `job_runtime_env`'s ``py_modules``, the new value keeps the old one)."""
    if not (set(env) - {"env_vars"}) & set(submitted_runtime_env()):
        yield
        return
    before = os.environ.get(OVERRIDE_JOB_RUNTIME_ENV)
    os.environ[OVERRIDE_JOB_RUNTIME_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[OVERRIDE_JOB_RUNTIME_ENV]
        else:
            os.environ[OVERRIDE_JOB_RUNTIME_ENV] = before


# A Ray fedray starts for one run has what the run needs and no more: no dashboard, and no metrics
# export (its port answers without Ray's token, on every interface). What still listens is
# docs/running.md's "What a run exposes".
PRIVATE_RAY = {"include_dashboard": False, "_system_config": {"enable_metrics_collection": False}}


# Ray resolves a node's address to the machine's reachable one (even "127.0.0.1" given to
# ray.init), so its agents listen on the network: the dashboard agent's HTTP port, whose health
# endpoints answer without the token, and the runtime-env agent. Where clusters are off (Ray's
# switch for macOS and Windows, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER), the node is loopback: a private
# Ray, this machine's alone, is started so, every server of it on 127.0.0.1 (docs/running.md).
LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextmanager
def _loopback_only() -> Iterator[None]:
    """While a private Ray starts: its node on loopback (the driver's own reading of the switch,
    and its processes', which read it from the environment they are started with)."""
    from ray._private import ray_constants

    before_env, before = os.environ.get(LOOPBACK_SWITCH), getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[LOOPBACK_SWITCH] = "0"
    if before is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if before_env is None:
            os.environ.pop(LOOPBACK_SWITCH, None)
        else:
            os.environ[LOOPBACK_SWITCH] = before_env
        if before is not None:
            ray_constants.ENABLE_RAY_CLUSTER = before


def _token_on_notice(record: logging.LogRecord) -> bool:
    """Drop Ray's WARNING that token authentication is on (what a private Ray should have, so it is
    no warning to the user); Ray's warning that it is off still shows."""
    return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def _owner_only(path: Path) -> None:
    """Ray writes its auth token readable by every user of the machine: make it the owner's only."""
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(path, 0o600)
    except OSError:
        pass


def kill_and_wait(actor: Any, timeout_s: float = 30.0) -> None:
    """``ray.kill`` the actor and wait until it is gone (``ray.kill`` only asks). A coordinator must
    be dead before its client actors are killed: alive, it would see them die and record its run as
    failed instead of interrupted."""
    ray.kill(actor)
    try:  # queued behind whatever it runs, so this returns once the actor has died
        ray.get(actor.__ray_ready__.remote(), timeout=timeout_s)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        pass


@dataclass
class RunHandle:
    """The Ray pieces of one run in flight, so another thread can stop it (a sweep on Ctrl-C)."""

    coordinator: Any = None
    group: ActorGroup | None = None
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True
        if self.coordinator is not None:
            ray.kill(self.coordinator)  # its generator then fails in the thread that streams it

    def free(self) -> None:
        """Coordinator first (see `kill_and_wait`), then the client actors and placement group."""
        if self.coordinator is not None:
            kill_and_wait(self.coordinator)
            self.coordinator = None
        if self.group is not None:
            self.group.close()
            self.group = None


STOPPED = "stopped from outside (Ctrl-C, SIGTERM, ray job stop)"


def stream_run(
    cfg: Config,
    num_actors: int | None = None,
    handle: RunHandle | None = None,
    restart: bool = False,
    fixed: bool = False,
    pool: ActorPool | None = None,
    group: ActorGroup | None = None,
) -> Iterator[Event]:
    """Run ``cfg`` on the connected Ray and yield its events; frees its actors when it ends.

    ``num_actors`` overrides the config's (a sweep's share of the cluster). When client actors are
    lost (a node gone, out of memory) the run starts again on new actors, on what is left of the
    cluster, from its latest checkpoint: up to ``max_failures`` times, each announced by a
    `Recovered` event. Stopped from outside, the run is recorded as ``interrupted``. ``fixed``: the
    cluster cannot grow (`launch_actors`). ``group``: client actors of the run's shape an earlier
    run left (a sweep's `ActorPool`), for its first attempt; ``pool``: where the run gives its
    actors back when it finishes (a run that fails or is stopped kills them instead), and whose
    idle actors it kills before it starts new ones.
    """
    handle = handle or RunHandle()
    run_id, failures, reason, rounds_done, ended, done = cfg.run_id(), 0, "", 0, False, False
    failed: Exception | None = None  # raised here, in the driver, not by the run
    try:
        while True:
            try:
                # Client actors start now, so their imports overlap with the coordinator's start-up.
                if group is not None and failures == 0:
                    handle.group, group = group, None
                else:
                    if pool is not None:
                        pool.evict()  # their resources, for the placement below
                    handle.group = launch_actors(cfg.to_dict(), num_actors, fixed)
                # Pin the coordinator to this node: it writes the results, and `--output` is a path here.
                here = ray.get_runtime_context().get_node_id()
                pin = NodeAffinitySchedulingStrategy(node_id=here, soft=False)
                handle.coordinator = Coordinator.options(scheduling_strategy=pin).remote()
                left = cfg.max_failures - failures
                for ref in handle.coordinator.run.remote(
                    cfg.to_dict(), handle.group, restart, reason, left, os.getcwd()
                ):
                    ev = ray.get(ref)
                    if isinstance(ev, RoundDone):
                        rounds_done = ev.round
                    elif isinstance(ev, Started):
                        rounds_done = ev.resumed_from
                    yield ev
                ended = done = True
                return
            except PlacementError as e:  # the driver's own, or the coordinator's wrapped in a RayTaskError
                ended = True
                error = unwrap(e)
                record_failure(cfg.output, run_id, cfg.recorded(), f"PlacementError: {error}")
                raise error from None
            except ray.exceptions.RayTaskError as e:
                error = unwrap(e)
                if not isinstance(error, WorkerLost) or failures >= cfg.max_failures:
                    ended = True
                    if isinstance(error, (PluginError, ConfigError)):  # before its writer could record it
                        record_failure(cfg.output, run_id, cfg.recorded(), f"{type(error).__name__}: {error}")
                    raise error from None
            except ray.exceptions.RayActorError as e:  # the coordinator itself died
                if handle.cancelled:
                    raise
                error = WorkerLost(f"the coordinator died: {e}")
                if failures >= cfg.max_failures:
                    handle.free()
                    mark_ended(cfg.output, run_id, "failed", rounds_done, f"WorkerLost: {error}")
                    ended = True
                    raise error from None
            failures += 1
            restart, reason = False, f"recovery {failures} of {cfg.max_failures} after: {error}"
            actors = len(handle.group.actors) if handle.group is not None else 0
            handle.free()
            num_actors = _actors_that_fit(cfg, actors)
            yield Recovered(run_id, failures, cfg.max_failures, str(error), num_actors)
    except Exception as e:
        if not ended and not handle.cancelled:
            failed = e
        raise
    finally:
        kept = handle.group if done and pool is not None and not handle.cancelled else None
        if kept is not None:
            handle.group = None  # free() below then stops only the coordinator
        handle.free()
        if kept is not None:
            pool.give(kept)
        if failed is not None:  # the driver's own error (its coordinator, if any, was killed)
            text = failure_text(failed)
            if not mark_ended(cfg.output, run_id, "failed", rounds_done, text):
                record_failure(cfg.output, run_id, cfg.recorded(), text)  # before the run had started
        elif not ended:  # Ctrl-C, SIGTERM, a cancelled sweep: the coordinator was killed, not asked
            mark_ended(cfg.output, run_id, "interrupted", rounds_done, STOPPED)


def _actors_that_fit(cfg: Config, before: int) -> int:
    """Actors for a run starting again after a loss: as many as before, fewer if the cluster that is
    left cannot hold them (the numbers are the same with any actor count)."""
    res = ray.cluster_resources()
    slots = actor_slots(
        cfg.num_cpus_per_actor, cfg.num_gpus_per_actor, res.get("CPU", 0.0), res.get("GPU", 0.0)
    )
    return max(1, min(before, slots)) if before else max(1, slots)


def disconnect() -> None:
    """Stop the Ray this process started (`connect` returned True) when no run follows."""
    ray.shutdown()


def cluster_gpus() -> float:
    """The GPUs of the connected Ray cluster."""
    return ray.cluster_resources().get("GPU", 0.0)


def auto_gpus(cpus_per_actor: float) -> float:
    """What ``num_gpus_per_actor: auto`` resolves to on the connected Ray: its live nodes' CPUs and
    GPUs (`fedray.federation.placement.auto_gpus_per_actor`)."""
    nodes = [
        (n["Resources"].get("CPU", 0.0), n["Resources"].get("GPU", 0.0))
        for n in ray.nodes()
        if n.get("Alive")
    ]
    return auto_gpus_per_actor(cpus_per_actor, nodes)


def run_on_ray(
    cfg: Config,
    address: str | None = None,
    restart: bool = False,
    started: bool | None = None,
    say: Callable[[str], None] | None = None,
) -> Iterator[Event]:
    """`fedray run` on Ray: connect (or start a private Ray, said to ``say``), run, and stop what we
    started. ``started``: the caller connected already (True: it started that Ray, which stops here)."""
    if started is None:
        started = connect(address, cfg.plugins, say)
    try:
        cfg = cfg.with_gpus(auto_gpus(cfg.num_cpus_per_actor)) if cfg.gpus_auto else cfg
        if said := unused_gpus(cluster_gpus(), [cfg]):
            logging.getLogger("fedray").warning("fedray: %s", said)
        yield from stream_run(cfg, restart=restart, fixed=started)
    finally:
        if started:
            ray.shutdown()
