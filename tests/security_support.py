"""Helpers of the authentication / authorization tests: a secret key, tokens,
and a real bookie + broker with token authentication (and authorization) on,
the broker using its own token towards the bookie."""
from __future__ import annotations

import time
from pathlib import Path

from broker.security.tokens import create_secret_key, create_token
from tests.procs import ProcessTracker, start_bookie, start_broker

# The role the test brokers present to the bookies and other brokers: a superuser, and the
# only role the test bookies serve (their authorized_roles).
BROKER_ROLE = "broker"


class Keys:
    """A secret key written under ``base`` and tokens signed with it."""

    def __init__(self, base: Path):
        self.secret = create_secret_key()
        self.path = base / "secret.key"
        self.path.write_bytes(self.secret)

    @property
    def url(self) -> str:
        """``file:///...`` of the key (the broker's ``token_secret_key``)."""
        return f"file://{self.path}"

    def token(self, role: str, expires_in_s: float | None = None, now: float | None = None) -> str:
        """A token for ``role`` (HS256), expiring ``expires_in_s`` after ``now`` when given."""
        return create_token(self.secret, role, "HS256",
                            None if expires_in_s is None else int(expires_in_s), now=now)


def toml_list(values) -> str:
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"


def start_secure_broker(base: Path, tracker: ProcessTracker, keys: Keys, authorization: bool = True,
                        superusers=("admin", "broker"), extra: str = ""):
    """A bookie refusing calls without a token (and every role but ``broker``: its
    ``authorized_roles``) and a broker with authentication (and ``authorization``) on,
    talking to the bookie with the token of role ``broker``.
    Returns ``(bookie, broker)`` processes."""
    bookie_conf = base / "bookie.toml"
    bookie_conf.write_text(f'authentication_enabled = true\ntoken_secret_key = "{keys.url}"\n'
                           f'authorized_roles = {toml_list([BROKER_ROLE])}\n')
    bookie = start_bookie(base / "bookie", journal_sync=False, extra_args=("--config", str(bookie_conf)),
                          tracker=tracker)
    broker_token = keys.token(BROKER_ROLE)
    conf = base / "broker.toml"
    conf.write_text(
        "managed_ledger_default_ensemble_size = 1\nmanaged_ledger_default_write_quorum = 1\n"
        "managed_ledger_default_ack_quorum = 1\n"
        "authentication_enabled = true\n"
        f"authorization_enabled = {'true' if authorization else 'false'}\n"
        f'authentication_providers = ["org.apache.pulsar.broker.authentication.AuthenticationProviderToken"]\n'
        f'token_secret_key = "{keys.url}"\n'
        f"superuser_roles = {toml_list(superusers)}\n"
        "authentication_refresh_check_seconds = 1\n"
        f'bookkeeper_client_authentication_parameters = "token:{broker_token}"\n'
        f'broker_client_authentication_parameters = "token:{broker_token}"\n' + extra)
    broker = start_broker(base / "broker", [bookie.address], config_file=conf, tracker=tracker)
    return bookie, broker


def wait_for(predicate, timeout_s: float, interval_s: float = 0.2) -> bool:
    """Poll ``predicate()`` until true or ``timeout_s`` passed; returns its last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def create_namespace(service_url: str, token: str, namespace: str, admin_roles=None, clusters=None) -> None:
    """Create ``namespace`` (and its tenant, with ``admin_roles``) as the role of ``token`` (blocking)."""
    import asyncio

    from client import AdminClient, AuthenticationToken

    async def run():
        async with AdminClient(service_url, operation_timeout_seconds=20,
                               authentication=AuthenticationToken(token)) as admin:
            tenant = namespace.split("/")[0]
            if tenant not in await admin.list_tenants():
                await admin.create_tenant(tenant, clusters, admin_roles)
            await admin.create_namespace(namespace)

    asyncio.run(run())
