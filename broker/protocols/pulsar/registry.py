"""Where the Pulsar-protocol listeners of a broker cluster are found: each broker
registers its ``pulsar://`` / ``pulsar+ssl://`` URLs under
``/loadbalance/pulsar-listeners/<host:port of its gRPC service URL>`` (ephemeral:
gone with its metadata session), so any broker answers a lookup with the owner's
Pulsar URL (Pulsar keeps them in the broker's LocalBrokerData)."""
from __future__ import annotations

import json

LISTENERS_ROOT = "/loadbalance/pulsar-listeners"


def _address(service_url: str) -> str:
    return service_url.split("://", 1)[-1]


async def pulsar_urls_of(service, broker_service_url: str) -> tuple[str, str]:
    """(``pulsar://`` URL, ``pulsar+ssl://`` URL or "") of the broker whose gRPC service URL
    is ``broker_service_url``, from its registration; ("", "") when it has none."""
    got = await service.metadata.get(f"{LISTENERS_ROOT}/{_address(broker_service_url)}")
    if got is None:
        return "", ""
    try:
        data = json.loads(got.value or b"{}")
    except ValueError:
        return "", ""
    return data.get("pulsar", ""), data.get("pulsar_tls", "")


async def register(store, service_url: str, url: str, url_tls: str) -> None:
    """Register this broker's Pulsar URLs (an ephemeral node of ``store``'s session)."""
    await store.put_ephemeral(f"{LISTENERS_ROOT}/{_address(service_url)}",
                              json.dumps({"pulsar": url, "pulsar_tls": url_tls}).encode(), None)
