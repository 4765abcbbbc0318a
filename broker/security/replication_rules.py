"""What only brokers and their replicators may write (issue 32, hostile tenants):
pure decisions, no I/O, called from the service layer (``service.edge_commands
.open_producer`` and ``PersistentTopic.publish``) so the gRPC edge and the Pulsar
binary protocol edge apply the same rules.

- **Markers are server-only** (Pulsar's ``Markers``: marker entries are written by
  the broker): an entry whose MessageMetadata carries ``marker_type`` is accepted only
  from a replicator producer forwarding a remote's marker (stamped with its
  ``replicated_from``, PIP-33), whatever the security settings.
- **``replicated_from`` comes from replicators only**: with authentication on, an
  entry carrying it is accepted only from a replicator producer (which could only
  be created by a role that may replicate). With authentication off there are no
  roles: brokers replicate anonymously, and any producer may set it (as before).
- **The replicator identity is reserved** (as ``pulsar.repl.`` subscription
  names are): a producer named ``pulsar.repl.<cluster>`` or created with
  ``is_replicator`` needs a role that may replicate: a superuser
  (``superuser_roles``) or a role of the broker setting ``replicator_roles``;
  with authorization off every caller may (there are no authorization decisions).
- **Clusters named by a tenant stay within its ``allowed_clusters``** (Pulsar's
  ``validateClusterForTenant``): namespace and topic replication clusters and the
  ``replicate_to`` list of a message a client sends.
"""
from __future__ import annotations

from typing import Iterable, Optional

from proto.common import REPLICATOR_CURSOR_PREFIX
from proto.errors import AuthorizationError, InvalidArgument, NotAllowed

__all__ = ["REPLICATOR_PREFIX", "may_replicate", "check_producer_identity", "check_entry_origin",
           "check_clusters_for_tenant"]

#: Producer-name prefix of the replicators (``pulsar.repl.<source cluster>``), Pulsar's ``replicatorPrefix``.
REPLICATOR_PREFIX = REPLICATOR_CURSOR_PREFIX


def may_replicate(role: Optional[str], authorization_enabled: bool, superuser_roles: Iterable[str],
                  replicator_roles: Iterable[str]) -> bool:
    """Whether ``role`` (None: no authentication) may act as a replicator: always
    with authorization off; else when it is a superuser or one of ``replicator_roles``."""
    if not authorization_enabled:
        return True
    return role is not None and (role in set(superuser_roles) or role in set(replicator_roles))


def check_producer_identity(name: Optional[str], is_replicator: bool, role: Optional[str],
                            allowed: bool) -> None:
    """Refuse a producer that claims the replicator identity (``name`` starting
    with ``pulsar.repl.``, or ``is_replicator``) unless ``allowed`` (see
    :func:`may_replicate`); raises AuthorizationError naming the role and the
    settings that would allow it."""
    claims = []
    if name and name.startswith(REPLICATOR_PREFIX):
        claims.append(f"producer name {name!r} (prefix {REPLICATOR_PREFIX!r} is reserved to replicators)")
    if is_replicator:
        claims.append("is_replicator = true")
    if claims and not allowed:
        raise AuthorizationError(f"role {role!r} may not act as a geo-replicator: {' and '.join(claims)}; "
                                 f"only superuser_roles and the broker's replicator_roles may")


def check_entry_origin(md, producer_name: str, is_replicator: bool, origin_checked: bool,
                       allowed_clusters: Optional[frozenset] = None) -> None:
    """Refuse an entry (its MessageMetadata ``md``) that a client may not write:

    - ``marker_type`` from a producer that is not a replicator, or from a
      replicator without ``replicated_from`` (a forwarded marker names its origin):
      NotAllowed (markers are server-only);
    - ``replicated_from`` from a non-replicator producer when ``origin_checked``
      (authentication on): AuthorizationError;
    - from a non-replicator producer, a ``replicate_to`` naming a cluster outside
      ``allowed_clusters`` (the tenant's; None: not checked): AuthorizationError.
    """
    has_origin = md.HasField("replicated_from")
    if md.HasField("marker_type"):
        if not is_replicator:
            raise NotAllowed(f"producer {producer_name!r} sent an entry with marker_type {md.marker_type}: "
                             f"markers are written by brokers only (server-side marker types)")
        if not has_origin:
            raise NotAllowed(f"replicator {producer_name!r} sent a marker without replicated_from: "
                             f"replicators forward markers stamped with their origin cluster")
    if is_replicator:
        return
    if has_origin and origin_checked:
        raise AuthorizationError(f"producer {producer_name!r} is not a replicator: replicated_from "
                                 f"({md.replicated_from!r}) is set by geo-replicators only")
    if allowed_clusters is not None and md.replicate_to:
        outside = sorted(set(md.replicate_to) - allowed_clusters)
        if outside:
            raise AuthorizationError(f"replicate_to names cluster(s) {', '.join(outside)} outside the tenant's "
                                     f"allowed clusters ({', '.join(sorted(allowed_clusters)) or 'none'})")


def check_clusters_for_tenant(clusters: Iterable[str], tenant: str, tenant_info: dict) -> None:
    """Pulsar's ``validateClusterForTenant`` for every cluster of ``clusters``:
    raises InvalidArgument naming those not in ``tenant_info["allowed_clusters"]``
    (``tenant``'s TenantInfo) and how to allow them."""
    allowed = list(tenant_info.get("allowed_clusters") or [])
    not_allowed = [c for c in clusters if c not in allowed]
    if not_allowed:
        raise InvalidArgument(f"cluster(s) {', '.join(not_allowed)} are not allowed for tenant {tenant} "
                              f"(allowed: {', '.join(allowed)}); update it with: minipulsar-admin tenants update")
