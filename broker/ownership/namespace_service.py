"""Bundle ownership, lookup and the load manager of a broker cluster (Pulsar's
``NamespaceService`` + ``OwnershipCache`` + ``ModularLoadManagerImpl``, simplified).

Runs only when the metadata store is shared (etcd). Metadata layout, as Pulsar's:

* ``/namespace/<tenant>/<ns>/<0xLOWER_0xUPPER>``: ephemeral, the bundle's owner
  ``{"nativeUrl": "minipulsar://host:port", "disabled": false}`` (``OwnershipCache``);
* ``/loadbalance/brokers/<host:port>``: ephemeral, the broker's ``LoadReport``;
* ``/loadbalance/leader``: ephemeral, ``{"serviceUrl": ...}`` of the leader broker;
* ``/admin/local-policies/<tenant>/<ns>``: ``{"bundles": {"boundaries": [...], "numBundles": n}}``
  once a bundle was split (absent: ``default_number_of_namespace_bundles`` equal bundles).

Lookup (Pulsar's ``NamespaceService.findBrokerServiceUrl``): an owned bundle answers
its owner. An unowned one is assigned by the leader to the least-loaded live broker
(``load_policy.select_broker``): a broker that is not the leader redirects the client
to the leader; the leader redirects it, ``authoritative``, to the chosen broker, which
takes the bundle (create-only ephemeral node: of two racing brokers one wins, the
other answers the winner). A broker serves a topic only while it owns its bundle.
When the broker's session is lost, it stops serving every bundle it owned (closing
their topics, so clients look up again) and registers again.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Optional

from broker.metadata.store import BadVersion, MetadataStoreError, NotFound, Notification, SessionEvent
from proto.topic_name import TopicName

from .bundles import Bundle, NamespaceBundles
from .load_policy import LoadReport, find_bundle_to_shed, select_broker
from .session_fencing import SessionFencing

__all__ = ["NamespaceService", "OWNERSHIP_ROOT", "BROKERS_ROOT", "LEADER_PATH"]

log = logging.getLogger(__name__)

OWNERSHIP_ROOT = "/namespace"
BROKERS_ROOT = "/loadbalance/brokers"
LEADER_PATH = "/loadbalance/leader"
LOCAL_POLICIES_ROOT = "/admin/local-policies"
# an owner read from the store is trusted this long (s) unless a watch reports a change of its
# node first; bounds a stale answer if a watch event was ever missed (etcd restarted)
OWNER_CACHE_TTL_S = 10.0


def _address(service_url: str) -> str:
    return service_url.split("://", 1)[-1]


class NamespaceService(SessionFencing):
    """Bundles, ownership, lookup and load management of one broker of a cluster.

    ``service``: the ``BrokerService`` (its ``topics``, ``rates``, ``unload_topic``);
    ``store``: a shared ``MetadataStore``; ``config``: the ``BrokerConfig``;
    ``service_url``: this broker's ``minipulsar://host:port``.
    Attributes: ``owned`` (``{str(bundle): Bundle}`` this broker serves), ``is_leader``.
    """

    def __init__(self, service, store, config, service_url: str):
        self.service = service
        self.store = store
        self.config = config
        self.service_url = service_url
        self.owned: dict[str, Bundle] = {}
        self.unloading: set[str] = set()
        self.is_leader = False
        self._bundles: dict[str, NamespaceBundles] = {}
        self._owners: dict[str, tuple] = {}       # ownership path -> (owner URL, monotonic s when read)
        self._pending: dict[str, int] = {}        # leader: bundles assigned per broker since its last report
        self._tasks: list[asyncio.Task] = []
        self._hook_tasks: set[asyncio.Task] = set()   # background tasks (hooks, re-election, drops)
        self._acquiring: dict[str, asyncio.Future] = {}
        self.instance_id = uuid.uuid4().hex  # this process's id in its ownership nodes
        self._unwatch = []
        self._closed = False
        self._cpu_last = (time.monotonic(), time.process_time())
        self._overloaded_before: Optional[str] = None
        self._channels: dict[str, object] = {}
        self._session_lost_at: Optional[float] = None
        self.has_session = True   # False from SESSION_LOST (set synchronously) to SESSION_REESTABLISHED
        self.metadata_connected = True   # False from CONNECTION_LOST to RECONNECTED / SESSION_REESTABLISHED

    # ---- life cycle -------------------------------------------------------
    async def start(self) -> None:
        """Register this broker (load report), join the leader election, watch ownership
        and bundle changes, start the report and shedding loops."""
        self._unwatch.append(self.store.watch(self._on_change, prefix=OWNERSHIP_ROOT))
        self._unwatch.append(self.store.watch(self._on_change, prefix=LOCAL_POLICIES_ROOT))
        self._unwatch.append(self.store.watch(self._on_change, prefix=LEADER_PATH))
        self._unwatch.append(self.store.add_session_listener(self._on_session_event))
        self._unwatch.append(self.store.add_session_listener(self._on_session_state))
        # every managed-ledger / cursor metadata write of this broker asks first (zombie fencing)
        self.service.ml_factory.metadata_write_guard = self.metadata_write_refusal
        await self.publish_load_report()
        await self._elect()
        self._tasks.append(asyncio.create_task(self._report_loop(), name="load-report"))
        self._tasks.append(asyncio.create_task(self._leader_loop(), name="load-shedding"))

    async def close(self) -> None:
        """Stop the loops and give up every owned bundle (their topics must be closed
        first: ``BrokerService.close`` does it), the broker registration and leadership."""
        self._closed = True
        for task in [*self._tasks, *self._hook_tasks]:
            task.cancel()
        for cancel in self._unwatch:
            cancel()
        for key in list(self.owned):
            await self._release(key)
        for path in (f"{BROKERS_ROOT}/{_address(self.service_url)}",) + ((LEADER_PATH,) if self.is_leader else ()):
            try:
                await self.store.delete(path)
            except (MetadataStoreError, NotFound):
                pass
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    # ---- bundles -----------------------------------------------------------
    async def bundles_of(self, namespace: str) -> NamespaceBundles:
        """The bundles of ``tenant/ns`` (cached; refreshed when they are split)."""
        cached = self._bundles.get(namespace)
        if cached is not None:
            return cached
        got = await self.store.get(f"{LOCAL_POLICIES_ROOT}/{namespace}")
        bundles = None
        if got is not None:
            try:
                data = json.loads(got.value or b"{}")
                bundles = NamespaceBundles.from_boundaries(namespace, data["bundles"]["boundaries"])
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("bundles of %s unreadable (%s): using %d equal bundles", namespace, exc,
                            self.config.default_number_of_namespace_bundles)
        if bundles is None:
            bundles = NamespaceBundles.equal(namespace, self.config.default_number_of_namespace_bundles)
        self._bundles[namespace] = bundles
        return bundles

    async def bundle_of(self, topic: str | TopicName) -> Bundle:
        """The bundle of a topic (a partition by its own full name)."""
        tn = topic if isinstance(topic, TopicName) else TopicName.get(topic)
        return (await self.bundles_of(tn.namespace)).find(str(tn))

    @staticmethod
    def ownership_path(bundle: Bundle) -> str:
        return f"{OWNERSHIP_ROOT}/{bundle.namespace}/{bundle.range}"

    async def owner_of(self, bundle: Bundle, cached: bool = True) -> Optional[str]:
        """The service URL of the bundle's owner, or None when nobody owns it. Answers
        from the ownership cache (Pulsar's ``OwnershipCache``) unless ``cached`` is False;
        the cache forgets a bundle when the metadata store reports a change of its node
        (etcd watches see every broker's changes)."""
        path = self.ownership_path(bundle)
        hit = self._owners.get(path) if cached else None
        if hit is not None and time.monotonic() - hit[1] < OWNER_CACHE_TTL_S:
            return hit[0]
        got = await self.store.get(path)
        owner = None
        if got is not None:
            try:
                owner = json.loads(got.value)["nativeUrl"]
            except (ValueError, KeyError, TypeError):
                owner = None
        if owner is not None:
            self._owners[path] = (owner, time.monotonic())
        return owner

    async def is_served_here(self, topic: TopicName) -> tuple[bool, Optional[Bundle]]:
        """``(True, bundle)`` when this broker owns the topic's bundle and is not unloading it."""
        bundle = await self.bundle_of(topic)
        key = str(bundle)
        return key in self.owned and key not in self.unloading, bundle

    def serves_bundle(self, bundle: Bundle) -> bool:
        """Whether this broker owns ``bundle`` and is not unloading it (no I/O: a topic
        load checks it right before the topic is registered, so an unload that started
        meanwhile either finds the topic or makes the load give up)."""
        key = str(bundle)
        return key in self.owned and key not in self.unloading

    async def check_serving(self, topic: TopicName, verify: bool = False) -> None:
        """Raise ``ServiceNotReady`` ("look it up again") unless this broker serves ``topic``.
        ``verify``: also read the ownership node (before a topic is loaded): a broker that
        was paused past its session timeout still believes it owns the bundle until it
        hears of the lost session, and must not open (and so fence) the managed ledger
        of the broker that took over."""
        from proto.errors import ServiceNotReady

        served, bundle = await self.is_served_here(topic)
        if served and verify and await self.owner_of(bundle, cached=False) != self.service_url:
            log.warning("bundle %s is no longer ours in the metadata store: dropping it", bundle)
            await self._drop_bundle(str(bundle))
            served = False
        if not served:
            state = "being unloaded" if str(bundle) in self.unloading else "not owned by this broker"
            raise ServiceNotReady(f"topic {topic} is not served by this broker ({self.service_url}): its bundle "
                                  f"{bundle} is {state}; look it up again")

    # ---- lookup --------------------------------------------------------------
    async def lookup(self, topic: str, authoritative: bool = False):
        """Answer a Lookup (see the module doc). Returns ``LookupAnswer``; raises
        ServiceNotReady while no live broker can take the bundle."""
        from broker.service.broker_service import LookupAnswer
        from proto.errors import ServiceNotReady

        tn = TopicName.get(topic)
        self.check_lookup_possible(tn)
        bundle = await self.bundle_of(tn)
        owner = await self.owner_of(bundle)
        if owner is not None:
            if owner == self.service_url and str(bundle) not in self.owned:
                # being acquired by this process, or a node of an earlier process of this broker
                # (same address: it is dead, we hold the port) waiting for its lease to expire
                pending = self._acquiring.get(str(bundle))
                owner = await asyncio.shield(pending) if pending is not None else await self._take_stale(bundle)
            return LookupAnswer(broker_service_url=owner)
        if not authoritative and not self.is_leader:
            leader = await self.leader_url()
            if leader is not None and leader != self.service_url:
                return LookupAnswer(broker_service_url=leader, redirect=True)
        if self.is_leader and not authoritative:
            candidate = await self._select_broker()
            if candidate is None:
                raise ServiceNotReady(f"no live broker to serve {tn}; retry")
            self._pending[candidate] = self._pending.get(candidate, 0) + 1
            if candidate != self.service_url:
                return LookupAnswer(broker_service_url=candidate, redirect=True, authoritative=True)
        return LookupAnswer(broker_service_url=await self.acquire(bundle))

    async def find_owner(self, topic: str, max_redirects: int = 5) -> str:
        """The service URL of the broker that serves ``topic``, following the lookup's
        redirects between brokers (assigning the bundle when unowned). Raises
        ServiceNotReady when no broker can take it."""
        import grpc

        from proto import broker_pb2 as pb
        from proto.broker_pb2_grpc import PulsarBrokerStub
        from proto.errors import ServiceNotReady, error_from_status

        answer = await self.lookup(topic)
        for _ in range(max_redirects):
            if not answer.redirect:
                return answer.broker_service_url
            stub = PulsarBrokerStub(self.channel_to(answer.broker_service_url))
            try:
                resp = await stub.Lookup(pb.LookupRequest(topic=topic, authoritative=answer.authoritative),
                                         timeout=10)
            except grpc.aio.AioRpcError as exc:
                raise error_from_status(exc.code(), exc.details() or "") from None
            from broker.service.broker_service import LookupAnswer
            answer = LookupAnswer(resp.broker_service_url, resp.response == pb.LookupResponse.REDIRECT,
                                  resp.authoritative)
        raise ServiceNotReady(f"lookup of {topic} redirected more than {max_redirects} times; retry")

    async def leader_url(self) -> Optional[str]:
        """The leader broker's service URL, or None while there is none."""
        got = await self.store.get(LEADER_PATH)
        if got is None:
            return None
        try:
            return json.loads(got.value)["serviceUrl"]
        except (ValueError, KeyError, TypeError):
            return None

    async def live_brokers(self) -> list[LoadReport]:
        """The load reports of the registered (live) brokers."""
        reports = []
        for name in await self.store.get_children(BROKERS_ROOT):
            got = await self.store.get(f"{BROKERS_ROOT}/{name}")
            if got is None:
                continue
            try:
                reports.append(LoadReport.from_json(json.loads(got.value)))
            except (ValueError, TypeError) as exc:
                log.warning("load report of %s unreadable: %s", name, exc)
        return reports

    async def _select_broker(self) -> Optional[str]:
        return select_broker(await self.live_brokers(), self._pending)

    async def acquire(self, bundle: Bundle) -> str:
        """Take ``bundle`` for this broker (create-only ephemeral node); returns the
        owner's URL: this broker's, or the broker that took it first. Concurrent calls
        for one bundle share one attempt."""
        key = str(bundle)
        if key in self.owned:
            return self.service_url
        pending = self._acquiring.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        fut = asyncio.get_running_loop().create_future()
        self._acquiring[key] = fut
        try:
            owner = await self._acquire(bundle)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: waiters re-raise it
            raise
        else:
            fut.set_result(owner)
            return owner
        finally:
            self._acquiring.pop(key, None)

    def _spawn(self, coro) -> None:
        """Run ``coro`` in the background, keeping a reference until it is done."""
        task = asyncio.get_running_loop().create_task(coro)
        self._hook_tasks.add(task)
        task.add_done_callback(self._hook_tasks.discard)

    def _node_value(self) -> bytes:
        # brokerId tells this process's nodes from those of an earlier process on the same address
        return json.dumps({"nativeUrl": self.service_url, "brokerId": self.instance_id,
                           "disabled": False}).encode()

    async def _acquire(self, bundle: Bundle) -> str:
        key = str(bundle)
        try:
            await self.store.put_ephemeral(self.ownership_path(bundle), self._node_value(), -1)
        except BadVersion:
            owner = await self.owner_of(bundle, cached=False)
            if owner is None:
                raise MetadataStoreError(f"bundle {bundle} changed owner while being acquired; retry")
            if owner == self.service_url:
                return await self._take_stale(bundle)
            return owner
        self._owned_now(key, bundle)
        return self.service_url

    def _owned_now(self, key: str, bundle: Bundle) -> None:
        self.owned[key] = bundle
        log.info("now owns bundle %s", bundle)
        hook = getattr(self.service, "on_bundle_owned", None)
        if hook is not None:
            self._spawn(hook(bundle))

    async def _take_stale(self, bundle: Bundle) -> str:
        """The ownership node names this broker's address: a node of an earlier process on
        this address (dead: this process holds the port) is deleted and the bundle taken;
        a node of this process is simply ours."""
        path = self.ownership_path(bundle)
        got = await self.store.get(path)
        if got is not None:
            try:
                data = json.loads(got.value)
            except ValueError:
                data = {}
            if data.get("brokerId") == self.instance_id:
                if str(bundle) not in self.owned:
                    self._owned_now(str(bundle), bundle)
                return self.service_url
            if data.get("nativeUrl") != self.service_url:
                return data.get("nativeUrl") or await self._acquire(bundle)
            log.info("bundle %s is held by an earlier process of this broker: taking it over", bundle)
            try:
                await self.store.delete(path, got.version)
            except (NotFound, BadVersion):
                pass
        return await self._acquire(bundle)

    # ---- unload and split ------------------------------------------------
    async def unload_bundle(self, bundle: Bundle) -> int:
        """Stop serving ``bundle`` (Pulsar's unloadNamespaceBundle): refuse new topic loads,
        close its topics (producers and consumers look up again), release its ownership
        node. Returns the number of topics closed. No-op (0) for a bundle not owned here."""
        key = str(bundle)
        if key not in self.owned:
            return 0
        self.unloading.add(key)
        closed = 0
        try:
            for name in [n for n in list(self.service.topics) if bundle.contains(n)]:
                try:
                    await self.service.unload_topic(name)
                    closed += 1
                except Exception as exc:  # noqa: BLE001 - unload the rest anyway
                    log.warning("unloading %s: %s", name, exc)
            await self._release(key)
        finally:
            self.unloading.discard(key)
        log.info("unloaded bundle %s (%d topics)", bundle, closed)
        return closed

    async def _release(self, key: str) -> None:
        bundle = self.owned.pop(key, None)
        if bundle is None:
            return
        try:
            got = await self.store.get(self.ownership_path(bundle))
            if got is not None and json.loads(got.value).get("brokerId") == self.instance_id:
                await self.store.delete(self.ownership_path(bundle), got.version)
        except (MetadataStoreError, NotFound, BadVersion, ValueError) as exc:
            log.warning("releasing bundle %s: %s", bundle, exc)

    async def split_bundle(self, bundle: Bundle) -> list[Bundle]:
        """Split an owned (or unowned) bundle in two (Pulsar's splitNamespaceBundle,
        range_equally_divide): the owner takes both halves, then the new boundaries are
        written (compare-and-set), then the old bundle's node is released. Loaded
        topics stay loaded. Returns the two new bundles. Raises ValueError for a bundle
        that is not one of the namespace's or too small."""
        namespace = bundle.namespace
        current = await self.bundles_of(namespace)
        current.get(bundle.range)
        halves = bundle.split(2)
        owned = str(bundle) in self.owned
        if owned:
            for half in halves:
                if await self.acquire(half) != self.service_url:
                    raise MetadataStoreError(f"bundle {half} is owned by another broker; retry the split")
        new = current.split(bundle)
        path = f"{LOCAL_POLICIES_ROOT}/{namespace}"
        got = await self.store.get(path)
        data = {}
        if got is not None:
            try:
                data = json.loads(got.value or b"{}")
            except ValueError:
                data = {}
        data["bundles"] = new.to_json()
        await self.store.put(path, json.dumps(data).encode(), got.version if got is not None else -1)
        self._bundles[namespace] = new
        if owned:
            await self._release(str(bundle))
        log.info("split bundle %s into %s", bundle, ", ".join(h.range for h in halves))
        return halves

    # ---- load reports and leadership -------------------------------------
    def load_report(self) -> LoadReport:
        """This broker's current ``LoadReport`` (rates from ``BrokerService.rates``)."""
        now, cpu = time.monotonic(), time.process_time()
        last_now, last_cpu = self._cpu_last
        self._cpu_last = (now, cpu)
        cpu_pct = 100.0 * (cpu - last_cpu) / max(1e-3, now - last_now)
        bundles = {key: {"topics": 0, "msg_rate_in": 0.0, "msg_rate_out": 0.0, "msg_throughput_in": 0.0,
                         "msg_throughput_out": 0.0} for key in self.owned}
        totals = {"msg_rate_in": 0.0, "msg_rate_out": 0.0, "msg_throughput_in": 0.0, "msg_throughput_out": 0.0}
        rates = getattr(self.service, "rates", {}) or {}
        for name in list(self.service.topics):
            bundle = next((b for b in self.owned.values() if b.contains(name)), None)
            r = rates.get(name, {})
            subs = r.get("subs", {}).values()
            values = {"msg_rate_in": r.get("msgRateIn", 0.0), "msg_throughput_in": r.get("msgThroughputIn", 0.0),
                      "msg_rate_out": sum(s.get("msgRateOut", 0.0) for s in subs),
                      "msg_throughput_out": sum(s.get("msgThroughputOut", 0.0) for s in subs)}
            for k, v in values.items():
                totals[k] += v
            if bundle is not None:
                entry = bundles[str(bundle)]
                entry["topics"] += 1
                for k, v in values.items():
                    entry[k] += v
        return LoadReport(service_url=self.service_url, bundles=bundles, topics=len(self.service.topics),
                          cpu=round(cpu_pct, 1), timestamp_ms=int(time.time() * 1000),
                          web_service_url=getattr(self.service, "web_service_url", "") or "", **totals)

    async def publish_load_report(self) -> None:
        """Write this broker's registration / load report (ephemeral)."""
        report = self.load_report()
        await self.store.put_ephemeral(f"{BROKERS_ROOT}/{_address(self.service_url)}",
                                       json.dumps(report.to_json()).encode(), None)
        if self.is_leader:
            self._pending.clear()

    async def _report_loop(self) -> None:
        interval = self.config.load_balancer_report_update_min_interval_millis / 1000.0
        while not self._closed:
            await asyncio.sleep(interval)
            try:
                await self.publish_load_report()
                if not self.is_leader and await self.leader_url() is None:
                    await self._elect()
            except Exception as exc:  # noqa: BLE001 - metadata store down: next round
                log.warning("load report not published: %s", exc)

    async def _elect(self) -> None:
        """Try to become the leader (create-only ephemeral ``/loadbalance/leader``)."""
        value = json.dumps({"serviceUrl": self.service_url}).encode()
        try:
            await self.store.put_ephemeral(LEADER_PATH, value, -1)
        except BadVersion:
            self.is_leader = await self.leader_url() == self.service_url
            return
        except MetadataStoreError as exc:
            log.warning("leader election: %s", exc)
            return
        self.is_leader = True
        log.info("this broker is now the leader (%s)", self.service_url)

    async def _leader_loop(self) -> None:
        interval = self.config.load_balancer_shedding_interval_minutes * 60.0
        while not self._closed:
            await asyncio.sleep(interval)
            if not self.is_leader or not self.config.load_balancer_enabled:
                continue
            try:
                await self._shed_once()
            except Exception as exc:  # noqa: BLE001 - next round
                log.warning("load shedding round failed: %s", exc)

    async def _shed_once(self) -> None:
        decision = find_bundle_to_shed(await self.live_brokers(),
                                       self.config.load_balancer_broker_overloaded_threshold_percentage)
        if decision is None:
            self._overloaded_before = None
            return
        if self._overloaded_before != decision.service_url:  # must stay overloaded two rounds
            self._overloaded_before = decision.service_url
            return
        self._overloaded_before = None
        namespace, _, range_text = decision.bundle.rpartition("/")
        log.info("load shedding: unloading bundle %s from overloaded broker %s", decision.bundle,
                 decision.service_url)
        await self.admin_call(decision.service_url, "namespaces.unload",
                              {"namespace": namespace, "bundle": range_text})

    # ---- broker-to-broker calls --------------------------------------------
    def channel_to(self, service_url: str):
        """A pooled gRPC channel to another broker of the cluster (secured as the
        broker's own links: ``service.broker_client_security``)."""
        from proto.channels import open_channel
        from proto.common import grpc_message_size_options

        channel = self._channels.get(service_url)
        if channel is None:
            from broker.tls_security import security_for_url

            channel = open_channel(_address(service_url), grpc_message_size_options(),
                                   security_for_url(self.service.broker_client_security, service_url, self.config))
            self._channels[service_url] = channel
        return channel

    async def admin_call(self, service_url: str, method: str, body: dict, timeout_s: float = 30.0) -> object:
        """Run admin ``method`` on another broker; returns its JSON answer (decoded).
        Raises the broker's error as ``proto.errors`` exceptions."""
        import grpc

        from proto import broker_pb2 as pb
        from proto.broker_pb2_grpc import PulsarBrokerStub
        from proto.errors import error_from_status

        stub = PulsarBrokerStub(self.channel_to(service_url))
        try:
            resp = await stub.Admin(pb.AdminRequest(method=method, body_json=json.dumps(body)), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise error_from_status(exc.code(), exc.details() or "") from None
        return json.loads(resp.body_json or "null")

    # ---- notifications -------------------------------------------------------
    def _on_change(self, n: Notification) -> None:
        if n.path.startswith(LOCAL_POLICIES_ROOT + "/"):
            namespace = n.path[len(LOCAL_POLICIES_ROOT) + 1:]
            self._bundles.pop(namespace, None)
            return
        self._owners.pop(n.path, None)
        if n.path == LEADER_PATH:
            if n.type == "deleted" and not self._closed:
                self.is_leader = False
                self._spawn(self._elect())
            return
        if n.type == "deleted":
            for key, bundle in list(self.owned.items()):
                if self.ownership_path(bundle) == n.path and key not in self.unloading:
                    # our node vanished (session lost, or removed by an operator): stop serving it
                    log.warning("lost ownership of bundle %s: closing its topics", bundle)
                    self._spawn(self._drop_bundle(key))

    async def _drop_bundle(self, key: str) -> None:
        bundle = self.owned.get(key)
        if bundle is None:
            return
        got = await self.store.get(self.ownership_path(bundle))
        if got is not None and json.loads(got.value).get("brokerId") == self.instance_id:
            return  # re-acquired meanwhile
        self.owned.pop(key, None)
        for name in [n for n in list(self.service.topics) if bundle.contains(n)]:
            try:
                await self.service.unload_topic(name)
            except Exception as exc:  # noqa: BLE001
                log.warning("closing %s after losing its bundle: %s", name, exc)

    async def _on_session_event(self, event: str) -> None:
        if event == SessionEvent.SESSION_LOST:
            self._session_lost_at = time.monotonic()
            owned = list(self.owned)
            log.warning("metadata store session lost: no longer serving %d bundle(s); closing their topics",
                        len(owned))
            self.owned.clear()
            self._owners.clear()
            self.is_leader = False
            for name in list(self.service.topics):
                try:
                    await self.service.unload_topic(name)
                except Exception as exc:  # noqa: BLE001
                    log.warning("closing %s after the session loss: %s", name, exc)
        elif event == SessionEvent.SESSION_REESTABLISHED:
            log.info("metadata store session re-established: registering this broker again")
            try:
                await self.publish_load_report()
                await self._elect()
            except Exception as exc:  # noqa: BLE001 - the report loop retries
                log.warning("re-registering after the session came back: %s", exc)
