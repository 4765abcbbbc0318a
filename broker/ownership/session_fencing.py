"""What a broker of a cluster may still do while its metadata store session is in doubt
(issue 33): a mixin of ``NamespaceService``. Pulsar's rules: a broker that lost its session
(ZooKeeper/etcd) or a bundle writes nothing more for that bundle
(``ManagedLedgerFactoryImpl.isMetadataServiceAvailable``, ``checkTopicNsOwnership``), and
answers lookups "not ready, ask another broker" (``ServiceNotReady``) instead of answering
from what it can no longer verify.

State (set by ``NamespaceService.__init__``): ``has_session`` (False from SESSION_LOST to
SESSION_REESTABLISHED), ``metadata_connected`` (False from CONNECTION_LOST to RECONNECTED),
both set synchronously inside the store's session event, before any asynchronous listener
runs; uses ``owned``, ``service_url``, ``store``, ``bundle_of``.
"""
from __future__ import annotations

from typing import Optional

from broker.metadata.store import SessionEvent
from proto.topic_name import TopicName

__all__ = ["SessionFencing"]


class SessionFencing:
    """The session- and ownership-based refusals of a broker (see the module doc)."""

    async def metadata_write_refusal(self, ml_name: str) -> Optional[str]:
        """Why this broker may not write the metadata of managed ledger ``ml_name``
        (``tenant/ns/persistent/topic``) now, or None when it may: it must hold its metadata
        session and own the topic's bundle (unloading included: the closing topic writes its
        last state). Pulsar checks the same before a topic's ledgers are touched
        (``isMetadataServiceAvailable``, ``checkTopicNsOwnership``). The ``ManagedLedgerFactory``'s
        ``metadata_write_guard``: a refusal fences the managed ledger."""
        if not self.has_session or getattr(self.store, "session_lease_id", 0) is None:
            return f"broker {self.service_url} lost its metadata store session"
        tenant, ns, domain, local = ml_name.split("/", 3)
        try:
            bundle = await self.bundle_of(TopicName.get(f"{domain}://{tenant}/{ns}/{local}"))
        except Exception as exc:  # noqa: BLE001 - cannot tell: refuse, as Pulsar does
            return f"ownership of {ml_name} unknown ({exc})"
        if str(bundle) not in self.owned:
            return f"bundle {bundle} is not owned by broker {self.service_url}"
        if not self.has_session:
            return f"broker {self.service_url} lost its metadata store session"
        return None

    def check_lookup_possible(self, tn: TopicName) -> None:
        """Raise ``MetadataSessionLost`` (retriable: the client asks the next host at once) when
        this broker cannot answer a lookup of ``tn``: its session is lost, or etcd is unreachable
        and the topic's bundle is not one it owns (an owned one it still answers itself)."""
        if self.has_session and self.metadata_connected:
            return
        known = self._bundles.get(tn.namespace)
        if not self.has_session or known is None or str(known.find(str(tn))) not in self.owned:
            from proto.errors import MetadataSessionLost
            raise MetadataSessionLost(
                f"broker {self.service_url} {'lost' if not self.has_session else 'cannot reach'} its metadata "
                f"store session and cannot tell who serves {tn}; ask another broker of the cluster")

    def _on_session_state(self, event: str) -> None:
        # synchronous (runs inside the store's event): no metadata write slips in before the
        # asynchronous listener below has dropped the bundles
        if event == SessionEvent.SESSION_LOST:
            self.has_session = False
        elif event == SessionEvent.SESSION_REESTABLISHED:
            self.has_session = self.metadata_connected = True
        elif event == SessionEvent.CONNECTION_LOST:
            self.metadata_connected = False
        elif event == SessionEvent.RECONNECTED:
            self.metadata_connected = True
