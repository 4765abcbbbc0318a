"""Broker configuration: one dataclass, loadable from TOML, overridable by flags.

Field names are Pulsar's broker.conf keys in snake_case; minipulsar's own are
bookies, data_dir, enable_fault_injection, replicator_mark_delete_rate_limit and
replicated_subscriptions_update_interval_millis.
"""
from __future__ import annotations

import dataclasses
import json
import re
import tomllib
import types
import typing
from typing import Any, Optional

from broker.ledger.ml_config import ManagedLedgerConfig, ManagedLedgerSettings
from proto.metadata_url import parse_metadata_store_url


@dataclasses.dataclass
class BrokerConfig(ManagedLedgerSettings):
    """Settings of one broker process (Pulsar's ServiceConfiguration); the
    managed-ledger keys come from :class:`ManagedLedgerSettings`."""

    cluster_name: str = "standalone"
    bookies: list[str] = dataclasses.field(default_factory=list)     # host:port of every bookie
    data_dir: str = "data/broker"                                   # metadata store lives here
    bind_address: str = "127.0.0.1"
    advertised_address: str = "127.0.0.1"
    broker_service_port: int = 6600                                 # gRPC (minipulsar:// URLs)
    # Pulsar's binary protocol for the official clients (Pulsar's brokerServicePort / brokerServicePortTls):
    # 0 = any free port, -1 = off. With tls_enabled every port serves TLS only: the Pulsar protocol is then
    # on broker_service_port_pulsar_tls (pulsar+ssl://) and broker_service_port_pulsar is not opened
    broker_service_port_pulsar: int = 6650
    broker_service_port_pulsar_tls: int = 6651
    web_service_port: int = 8080                                    # HTTP: Prometheus /metrics
    allow_auto_topic_creation: bool = True
    broker_deduplication_enabled: bool = False
    broker_deduplication_entries_interval: int = 1000               # entries between dedup snapshots
    max_message_size: int = 5 * 1024 * 1024                         # bytes
    # bytes of an Admin request's JSON body (Pulsar's httpMaxRequestSize, there -1 = unlimited): a
    # multi-megabyte body held the event loop while it was parsed; no admin verb needs 1 MiB
    http_max_request_size: int = 1024 * 1024
    dispatcher_max_read_batch_size: int = 100                       # entries per cursor read
    # a dispatcher's failed read is tried again after this backoff (ms), doubling up to the max
    dispatcher_read_failure_backoff_initial_time_in_ms: int = 15000
    dispatcher_read_failure_backoff_max_time_in_ms: int = 60000
    max_unacked_messages_per_consumer: int = 50000
    enable_fault_injection: bool = False                            # tests: admin topics.inject_send_failure
    # bookie client: an add a bookie has not answered in this time (s) counts as that bookie
    # failing (ensemble change, or NotEnoughBookies without a spare); reads keep the client's
    # 10 s RPC deadline. Pulsar's bookkeeperClientTimeoutInSeconds (BookKeeper's addEntryTimeout)
    bookkeeper_client_timeout_in_seconds: float = 30.0
    # geo-replication / replicated subscriptions
    replication_policy_check_duration_seconds: int = 600
    replication_producer_queue_size: int = 1000
    # persists/s of a replicator cursor (Pulsar's managedLedgerDefaultMarkDeleteRateLimit, applied to
    # replicator cursors only: re-sent entries after a crash are dropped by the remote's source-position dedup)
    replicator_mark_delete_rate_limit: float = 10.0
    enable_replicated_subscriptions: bool = True
    replicated_subscriptions_snapshot_frequency_millis: int = 1000
    replicated_subscriptions_snapshot_timeout_seconds: int = 30
    replicated_subscriptions_snapshot_max_cached_per_subscription: int = 30
    # beyond PIP-33: UPDATEs between snapshots carrying acknowledged origins, at most this often
    replicated_subscriptions_update_interval_millis: int = 100
    # broker clusters (Pulsar's metadataStoreUrl, metadataStoreSessionTimeoutMillis,
    # defaultNumberOfNamespaceBundles, loadBalancer* keys): "" or "sqlite:PATH" = one standalone
    # broker on its own SQLite file; "etcd://host:port[,host:port]" = a broker of a cluster
    metadata_store_url: str = ""
    # Pulsar's configurationMetadataStoreUrl: clusters, tenants, namespace policies and partitioned
    # topics shared by several clusters (geo-replication); "" = kept in metadata_store_url's store
    configuration_metadata_store_url: str = ""
    metadata_store_session_timeout_millis: int = 5000
    default_number_of_namespace_bundles: int = 4
    load_balancer_enabled: bool = True
    # a broker whose message rate stays above the cluster average by this much (%) sheds its busiest bundle
    load_balancer_broker_overloaded_threshold_percentage: float = 85.0
    load_balancer_report_update_min_interval_millis: int = 5000
    load_balancer_shedding_interval_minutes: float = 1.0
    # security (Pulsar's authenticationEnabled, authenticationProviders, tokenSecretKey / tokenPublicKey as
    # file:///path or data:;base64,..., superUserRoles, authorizationEnabled, authenticationRefreshCheckSeconds);
    # the broker's own credentials towards other brokers and remote clusters (brokerClientAuthenticationPlugin /
    # Parameters: token:<jwt> or file:///path) and towards the bookies (bookkeeperClientAuthentication*)
    authentication_enabled: bool = False
    authentication_providers: list[str] = dataclasses.field(default_factory=list)
    token_secret_key: str = ""
    token_public_key: str = ""
    superuser_roles: list[str] = dataclasses.field(default_factory=list)
    authorization_enabled: bool = False
    authentication_refresh_check_seconds: int = 60
    # roles that may act as geo-replicators here besides the superusers (a producer named pulsar.repl.<cluster>
    # or with is_replicator, entries with replicated_from): the roles remote clusters' replicators present
    # (their clusters create --auth-params); with authorization off every role may (issue 32)
    replicator_roles: list[str] = dataclasses.field(default_factory=list)
    # Pulsar's authenticateMetricsEndpoint: /metrics (every tenant's topic names) needs a token (Authorization:
    # Bearer) of a superuser role, as newer Pulsar versions check (any valid token with authorization off);
    # off by default (as in Pulsar); needs authentication_enabled
    authenticate_metrics_endpoint: bool = False
    broker_client_authentication_plugin: str = ""
    broker_client_authentication_parameters: str = ""
    bookkeeper_client_authentication_plugin: str = ""
    bookkeeper_client_authentication_parameters: str = ""
    # TLS (Pulsar's tlsEnabled family): tls_enabled = the gRPC port (broker_service_port) and the HTTP
    # port serve TLS only, with this certificate and key (PEM); the broker's URL is minipulsar+ssl://.
    # tls_trust_certs_file_path: the CA of client certificates; tls_require_trusted_client_cert_on_connect:
    # mutual TLS (clients must present a certificate that CA signed)
    tls_enabled: bool = False
    tls_certificate_file_path: str = ""
    tls_key_file_path: str = ""
    tls_trust_certs_file_path: str = ""
    tls_require_trusted_client_cert_on_connect: bool = False
    # the broker's own links to other brokers and remote clusters (broker-to-broker calls, replicators):
    # brokerClientTlsEnabled, brokerClientTrustCertsFilePath, brokerClientCertificateFilePath /
    # brokerClientKeyFilePath (a client certificate for mutual TLS)
    broker_client_tls_enabled: bool = False
    broker_client_trust_certs_file_path: str = ""
    broker_client_certificate_file_path: str = ""
    broker_client_key_file_path: str = ""
    # links to the bookies: bookkeeper_tls_enabled (minipulsar's: gRPC has no STARTTLS, so say it) and
    # Pulsar's bookkeeperTLSTrustCertsFilePath, bookkeeperTLSClientAuthentication (present
    # bookkeeperTLSCertificateFilePath / bookkeeperTLSKeyFilePath to bookies that require client certificates)
    bookkeeper_tls_enabled: bool = False
    bookkeeper_tls_trust_certs_file_path: str = ""
    bookkeeper_tls_client_authentication: bool = False
    bookkeeper_tls_certificate_file_path: str = ""
    bookkeeper_tls_key_file_path: str = ""
    # managed ledger / bookkeeper keys: inherited from ManagedLedgerSettings

    def managed_ledger_config(self) -> ManagedLedgerConfig:
        """The ManagedLedgerConfig of this broker's topics: its managed-ledger keys,
        and entries of up to ``max_message_size`` + 64 KiB of metadata (bytes)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(ManagedLedgerSettings)}
        return ManagedLedgerConfig(**values, max_entry_size_bytes=self.max_message_size + 64 * 1024)

    @staticmethod
    def load_toml(path: str) -> dict[str, Any]:
        """The key/value table of a TOML file (keys at top level or under ``[broker]``),
        unchecked. Raises ConfigError when the file cannot be read or is not TOML."""
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise ConfigError([f"cannot read the config file: {exc.strerror or exc}"], path) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError([f"not valid TOML: {exc}"], path) from None
        if "broker" in data and isinstance(data["broker"], dict):
            data = data["broker"]
        return data

    @classmethod
    def from_toml(cls, path: str) -> "BrokerConfig":
        """Load a TOML file (keys at top level or under ``[broker]``); raises
        ConfigError (a ValueError) listing every unknown key, wrongly typed or
        out-of-range value."""
        return cls.from_dict(cls.load_toml(path), source=path)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "broker config") -> "BrokerConfig":
        """A config from ``data`` (missing keys keep their defaults); raises
        ConfigError (a ValueError) listing every problem of the given values."""
        config, problems = cls.parse(data)
        if problems:
            raise ConfigError(problems, source)
        return config

    @classmethod
    def parse(cls, data: dict[str, Any], complete: bool = False) -> tuple["BrokerConfig", list[str]]:
        """Check ``data`` against the fields: unknown keys, types (the annotations;
        an int is accepted for a float), ranges and the quorums E >= Qw >= Qa >= 1.
        ``complete``: ``data`` is a whole process's config, so also check that it
        names bookies (at least E of them). Returns the config (a bad value is left
        at its default) and every problem found, one line each."""
        if not isinstance(data, dict):
            return cls(), [f"expected a table of broker settings, got {_describe(data)}"]
        hints = _field_types(cls)
        problems: list[str] = []
        unknown = sorted(set(data) - set(hints))
        if unknown:
            problems.append(f"unknown broker config keys: {', '.join(unknown)} "
                            f"(known keys are the fields of broker/config.py)")
        values: dict[str, Any] = {}
        for key in sorted(set(data) & set(hints)):
            value, problem = _check_type(key, hints[key], data[key])
            if problem:
                problems.append(problem)
            else:
                values[key] = value
        config = cls(**values)
        problems += config._range_problems(complete, bad=(set(data) & set(hints)) - set(values))
        return config, problems

    def validate(self) -> list[str]:
        """Every problem of this config as the config of a running broker (types,
        ranges, quorums, bookies), one line each; [] when it can serve."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return type(self).parse(values, complete=True)[1]

    def _range_problems(self, complete: bool, bad: set[str] = frozenset()) -> list[str]:
        """Problems of the (well-typed) values: ranges and the cross-field rules
        (skipped for the rules involving a ``bad`` key, already reported)."""
        problems: list[str] = []

        def check(key: str, ok: bool, rule: str) -> None:
            """Add ``"<key> = <value>: <rule>"`` to the problems unless ``ok``."""
            if not ok:
                problems.append(f"{key} = {_describe(getattr(self, key), bare=True)}: {rule}")

        for key, lo in _MIN_VALUES.items():
            check(key, getattr(self, key) >= lo, f"must be >= {lo}")
        check("bookkeeper_client_timeout_in_seconds", self.bookkeeper_client_timeout_in_seconds > 0, "must be > 0")
        check("managed_ledger_cache_eviction_watermark", 0 < self.managed_ledger_cache_eviction_watermark <= 1,
              "must be a fraction of managed_ledger_cache_size_mb in (0, 1]")
        check("broker_service_port", 0 <= self.broker_service_port <= 65535,
              "must be a TCP port in 0..65535 (0 = any free port)")
        for key in ("broker_service_port_pulsar", "broker_service_port_pulsar_tls"):
            check(key, -1 <= getattr(self, key) <= 65535,
                  "must be a TCP port in 0..65535 (0 = any free port) or -1 (no Pulsar-protocol listener)")
        check("web_service_port", -1 <= self.web_service_port <= 65535,
              "must be a TCP port in 0..65535 (0 = any free port) or -1 (no HTTP endpoint)")
        check("max_message_size", self.max_message_size <= MAX_MESSAGE_SIZE_LIMIT,
              f"must be at most {MAX_MESSAGE_SIZE_LIMIT} bytes (gRPC frames of 64 MiB, minus room for metadata)")
        check("cluster_name", bool(_NAME.fullmatch(self.cluster_name)) and self.cluster_name not in (".", ".."),
              "must be a name of letters, digits, '-', '_', '=', ':' or '.' (not only dots)")
        for key in ("data_dir", "bind_address", "advertised_address"):
            check(key, bool(getattr(self, key).strip()), "must not be empty")
        bad_bookies = [b for b in self.bookies if not _is_address(b)]
        check("bookies", not bad_bookies,
              f"{', '.join(map(repr, bad_bookies))}: each bookie must be 'host:port' with a port in 1..65535")
        try:
            store_kind = parse_metadata_store_url(self.metadata_store_url)[0]
        except ValueError as exc:
            store_kind = None
            problems.append(f"metadata_store_url = {_describe(self.metadata_store_url, bare=True)}: {exc}")
        check("load_balancer_broker_overloaded_threshold_percentage",
              self.load_balancer_broker_overloaded_threshold_percentage >= 0, "must be >= 0")
        check("load_balancer_shedding_interval_minutes", self.load_balancer_shedding_interval_minutes > 0, "must be > 0")
        if self.configuration_metadata_store_url:
            try:
                parse_metadata_store_url(self.configuration_metadata_store_url)
            except ValueError as exc:
                problems.append(f"configuration_metadata_store_url = "
                                f"{_describe(self.configuration_metadata_store_url, bare=True)}: {exc}")
        problems.extend(_tls_problems(self))
        registered = store_kind == "etcd"  # bookies found under /ledgers/available
        if complete and not self.bookies and "bookies" not in bad and not registered:
            problems.append('bookies is empty: give the bookies as bookies = ["host:port", ...] '
                            '(or --bookies host:port,...)')
        e = self.managed_ledger_default_ensemble_size
        qw = self.managed_ledger_default_write_quorum
        qa = self.managed_ledger_default_ack_quorum
        quorum_keys = {"managed_ledger_default_ensemble_size", "managed_ledger_default_write_quorum",
                       "managed_ledger_default_ack_quorum"}
        if min(e, qw, qa) >= 1 and not e >= qw >= qa and not quorum_keys & bad:
            problems.append(f"quorums must satisfy ensemble size >= write quorum >= ack quorum >= 1, got "
                            f"managed_ledger_default_ensemble_size = {e}, managed_ledger_default_write_quorum = {qw}, "
                            f"managed_ledger_default_ack_quorum = {qa}")
        if complete and self.bookies and e > len(self.bookies) and not quorum_keys & bad:
            problems.append(f"managed_ledger_default_ensemble_size = {e} but only {len(self.bookies)} bookie(s) are "
                            f"configured: no ledger could be created; add bookies or lower the ensemble size")
        problems += self._security_problems()
        if self.managed_ledger_min_ledger_rollover_time_minutes > self.managed_ledger_max_ledger_rollover_time_minutes:
            problems.append("managed_ledger_min_ledger_rollover_time_minutes must not exceed "
                            "managed_ledger_max_ledger_rollover_time_minutes")
        return problems

    def _security_problems(self) -> list[str]:
        """Problems of the authentication / authorization keys: authorization without
        authentication, no usable token key, bad client credentials."""
        problems: list[str] = []
        if self.authentication_refresh_check_seconds < 1:
            problems.append(f"authentication_refresh_check_seconds = {self.authentication_refresh_check_seconds}: "
                            f"must be >= 1")
        if self.authorization_enabled and not self.authentication_enabled:
            problems.append("authorization_enabled = true needs authentication_enabled = true "
                            "(roles come from the authenticated tokens)")
        if self.authenticate_metrics_endpoint and not self.authentication_enabled:
            problems.append("authenticate_metrics_endpoint = true needs authentication_enabled = true "
                            "(the metrics endpoint checks the caller's token)")
        if self.authentication_enabled:
            from broker.security.authentication import AuthenticationService
            from broker.security.tokens import TokenError
            try:
                AuthenticationService.from_config(self)
            except TokenError as exc:
                problems.append(f"authentication_enabled = true: {exc}")
        from proto.authentication import authentication_from_params
        from proto.errors import InvalidConfiguration
        for prefix in ("broker_client", "bookkeeper_client"):
            try:
                authentication_from_params(getattr(self, f"{prefix}_authentication_plugin"),
                                           getattr(self, f"{prefix}_authentication_parameters"))
            except InvalidConfiguration as exc:
                problems.append(f"{prefix}_authentication_parameters: {exc.message}")
        return problems

    def override(self, **values: Optional[Any]) -> "BrokerConfig":
        """A copy with the non-None ``values`` applied (CLI flags)."""
        return dataclasses.replace(self, **{k: v for k, v in values.items() if v is not None})


class ConfigError(ValueError):
    """A configuration that cannot be used; ``problems`` lists every problem, one line each."""

    def __init__(self, problems: list[str], source: str = "broker config"):
        self.problems = list(problems)
        self.source = source
        super().__init__(f"{source}: {len(self.problems)} problem(s):\n  - " + "\n  - ".join(self.problems))


MAX_MESSAGE_SIZE_LIMIT = 64 * 1024 * 1024 - 64 * 1024
_NAME = re.compile(r"[-=:.\w]+")       # as tenant/namespace/cluster names (broker/service/resources.py)

# key -> smallest allowed value
_MIN_VALUES: dict[str, float] = {
    "broker_deduplication_entries_interval": 1,
    "max_message_size": 1,
    "http_max_request_size": 1024,
    "dispatcher_max_read_batch_size": 1,
    "dispatcher_read_failure_backoff_initial_time_in_ms": 1,
    "dispatcher_read_failure_backoff_max_time_in_ms": 1,
    "max_unacked_messages_per_consumer": 0,               # 0 = unlimited (Pulsar)
    "replication_policy_check_duration_seconds": 1,
    "replication_producer_queue_size": 1,
    "replicator_mark_delete_rate_limit": 0,              # 0 = no limit
    "replicated_subscriptions_snapshot_frequency_millis": 1,
    "replicated_subscriptions_snapshot_timeout_seconds": 1,
    "replicated_subscriptions_snapshot_max_cached_per_subscription": 1,
    "replicated_subscriptions_update_interval_millis": 0,
    "managed_ledger_max_entries_per_ledger": 1,
    "managed_ledger_max_size_per_ledger_mb": 1,
    "managed_ledger_min_ledger_rollover_time_minutes": 0,
    "managed_ledger_max_ledger_rollover_time_minutes": 0,
    "managed_ledger_default_ensemble_size": 1,
    "managed_ledger_default_write_quorum": 1,
    "managed_ledger_default_ack_quorum": 1,
    "managed_ledger_cache_size_mb": 0,                   # 0 = no entry cache
    "managed_ledger_cache_eviction_interval_ms": 0,      # 0 = no eviction task (only the size cap evicts)
    "managed_ledger_cache_eviction_time_threshold_millis": 0,   # 0 = no eviction by age
    "managed_ledger_cursor_max_entries_per_ledger": 1,
    "default_retention_time_in_minutes": -1,             # -1 = keep forever
    "default_retention_size_in_mb": -1,
    "metadata_store_session_timeout_millis": 1000,
    "default_number_of_namespace_bundles": 1,
    "load_balancer_report_update_min_interval_millis": 100,
}


def _tls_problems(config: "BrokerConfig") -> list[str]:
    """TLS settings that cannot work: TLS on without a certificate and key, a
    certificate without its key (or the reverse), mutual TLS without the CA of
    the client certificates, a bookie client certificate without its key or
    without ``bookkeeper_tls_client_authentication``. Files are read at start."""
    problems = []

    def pair(cert_key: str, key_key: str, needed: bool, why: str) -> None:
        cert, key = getattr(config, cert_key), getattr(config, key_key)
        if bool(cert) != bool(key):
            problems.append(f"{cert_key} and {key_key} go together (got {cert_key} = {_describe(cert, bare=True)}, "
                            f"{key_key} = {_describe(key, bare=True)})")
        elif needed and not cert:
            problems.append(f"{why} needs {cert_key} and {key_key} (PEM files; `minipulsar tls create-cert`)")

    pair("tls_certificate_file_path", "tls_key_file_path", config.tls_enabled, "tls_enabled = true")
    if config.tls_require_trusted_client_cert_on_connect and not config.tls_trust_certs_file_path:
        problems.append("tls_require_trusted_client_cert_on_connect = true needs tls_trust_certs_file_path (the CA "
                        "that signs the clients' certificates)")
    pair("broker_client_certificate_file_path", "broker_client_key_file_path", False, "")
    pair("bookkeeper_tls_certificate_file_path", "bookkeeper_tls_key_file_path",
         config.bookkeeper_tls_client_authentication, "bookkeeper_tls_client_authentication = true")
    if config.bookkeeper_tls_client_authentication and not config.bookkeeper_tls_enabled:
        problems.append("bookkeeper_tls_client_authentication = true needs bookkeeper_tls_enabled = true "
                        "(client certificates travel in the TLS handshake)")
    return problems


def _field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _describe(value: Any, bare: bool = False) -> str:
    """``value`` as TOML writes it, named as TOML calls it unless ``bare``:
    'the string "5MB"', 'the integer 99999', 'the array ["a"]'."""
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, (str, list, dict)):
        text = json.dumps(value, default=str)
    else:
        text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    if bare:
        return text
    kind = {bool: "the boolean", int: "the integer", float: "the float", str: "the string",
            list: "the array", dict: "the table"}.get(type(value), f"a {type(value).__name__}")
    return f"{kind} {text}"


_EXPECTED = {bool: ("true or false", "booleans"), int: ("an integer", "integers"), float: ("a number", "numbers"),
             str: ("a string", "strings")}


def _check_type(key: str, hint: Any, value: Any) -> tuple[Any, Optional[str]]:
    """``(value, None)`` when ``value`` fits the annotation ``hint`` (an int is
    widened to a float), else ``(None, problem)``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None, None
        if len(args) == 1:
            return _check_type(key, args[0], value)
        return value, None
    if typing.get_origin(hint) is list:
        item = (typing.get_args(hint) or (Any,))[0]
        checked = [_check_type(key, item, v) for v in value] if isinstance(value, list) else None
        if checked is not None and all(problem is None for _, problem in checked):
            return [v for v, _ in checked], None
        example = ' like ["127.0.0.1:3181", "127.0.0.1:3182"]' if key == "bookies" else ""
        what = _EXPECTED[item][1] if item in _EXPECTED else "values"
        return None, f"{key}: expected an array of {what}{example}, got {_describe(value)}"
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value), None
    if hint in _EXPECTED:
        if isinstance(value, hint) and not (hint is not bool and isinstance(value, bool)):
            return value, None
        return None, f"{key}: expected {_EXPECTED[hint][0]}, got {_describe(value)}"
    return value, None


def _is_address(address: str) -> bool:
    host, sep, port = address.rpartition(":")
    return bool(sep and host.strip() and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535)
