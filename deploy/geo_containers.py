"""The ``minipulsar geo`` actions run inside the compose stacks' containers (see
``deploy/compose.py``): ``geo setup`` (the registration ``geo up`` does: the
``geo-setup`` service), ``geo broker`` (one broker of a cluster from the
topology), ``geo probe`` (the health checks) and, for the TLS stack
(``docker-compose.tls.yml``), ``geo certs`` (the demo CA and node certificate
once; ``--auth``: also the token key and tokens of ``geo up --auth``, beside
them in ``<tls-dir>/auth``), with ``--tls-dir`` / ``--auth-dir`` on ``broker``,
``setup`` and ``probe``. Errors are ``GeoError`` (printed by ``deploy.geo``).
"""
from __future__ import annotations

import asyncio
import dataclasses
import signal
import socket
import sys
import time
from pathlib import Path

from deploy.geo_auth import AUTH_DIR, ensure_auth_material, missing_auth_files
from deploy.geo_processes import GeoError, _port_open
from deploy.topology import DEFAULT_TOPOLOGY, Topology, load_topology
from proto.common import run_async

__all__ = ["add_container_arguments", "create_tls_material", "cmd_setup", "cmd_certs", "cmd_broker", "cmd_probe"]


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def create_tls_material(topo: Topology, tls_dir: Path) -> Topology:
    """The demo CA (``ca.cert.pem`` / ``ca.key.pem``) and the node certificate
    (``node.cert.pem`` / ``node.key.pem``, SANs ``topo.host``, 127.0.0.1, localhost)
    in ``tls_dir``, each created only when missing (so a restart keeps them). Returns
    ``topo`` with ``tls_dir`` set; raises ``TlsCertError`` / ``OSError``."""
    from deploy.tls_certs import create_ca, create_cert

    if not (tls_dir / "ca.cert.pem").exists():
        create_ca(str(tls_dir), "minipulsar geo demo CA")
    if not (tls_dir / "node.cert.pem").exists():
        hosts = list(dict.fromkeys([topo.host.strip("[]"), "127.0.0.1", "localhost"]))
        create_cert(str(tls_dir), "node", hosts, server=True, client=True)
    return dataclasses.replace(topo, tls_dir=str(tls_dir.resolve()))


def _with_tls_dir(topo: Topology, tls_dir: str | None, auth_dir: str | None = None) -> Topology:
    """``--tls-dir DIR`` of the container actions: ``topo`` over TLS with the CA and node
    certificate of ``DIR`` (GeoError when they are missing); ``--auth-dir AUTH``: with the
    token authentication of ``geo up --auth``, its key and tokens in ``AUTH`` (GeoError when
    missing); ``topo`` unchanged without either."""
    if auth_dir:
        missing = missing_auth_files(auth_dir)
        if missing:
            raise GeoError(f"--auth-dir {auth_dir}: missing {', '.join(missing)} (create them with `minipulsar geo "
                           f"certs --tls-dir DIR --auth`, which writes DIR/{AUTH_DIR})")
        topo = dataclasses.replace(topo, auth_dir=str(Path(auth_dir).resolve()))
    if not tls_dir:
        return topo
    missing = [f for f in ("ca.cert.pem", "node.cert.pem", "node.key.pem") if not (Path(tls_dir) / f).is_file()]
    if missing:
        raise GeoError(f"--tls-dir {tls_dir}: missing {', '.join(missing)} (create them with `minipulsar geo certs "
                       f"--tls-dir {tls_dir}`)")
    return dataclasses.replace(topo, tls_dir=str(Path(tls_dir).resolve()))


def cmd_setup(args) -> int:
    """``geo setup``: only the registration (for the compose ``geo-setup`` service;
    ``--compose``: the brokers' ports may be moved by ``MINIPULSAR_PORT_<CLUSTER>_<i>``)."""
    from deploy.geo_setup import run_setup

    topo = _with_tls_dir(load_topology(args.topology or DEFAULT_TOPOLOGY), args.tls_dir, args.auth_dir)
    if args.compose:
        topo = topo.with_broker_ports()
    return run_setup(topo, timeout_s=args.timeout)


def _tls_material_complete(tls_dir: Path, auth: bool = False) -> bool:
    """True when ``tls_dir`` holds a loadable CA certificate and node certificate + key
    (``auth``: and the token key and tokens in ``tls_dir/auth``)."""
    import ssl

    if auth and (not (tls_dir / AUTH_DIR).is_dir() or missing_auth_files(tls_dir / AUTH_DIR)):
        return False

    try:
        ctx = ssl.create_default_context(cafile=str(tls_dir / "ca.cert.pem"))
        ctx.load_cert_chain(str(tls_dir / "node.cert.pem"), str(tls_dir / "node.key.pem"))
        return True
    except (OSError, ssl.SSLError, ValueError):
        return False


def cmd_certs(args) -> int:
    """``geo certs --tls-dir DIR``: the demo CA and node certificate in DIR, created once
    (the compose ``geo-certs`` service of ``docker-compose.tls.yml``). ``--check``: only
    exit 0 when they are there and load, 1 otherwise (its health check).
    ``--auth``: also the secret key and the brokers' and administrator's tokens of
    ``geo up --auth`` in ``DIR/auth`` (created once; ``--check --auth`` checks them too).
    ``--keep-running``: then wait for SIGTERM/SIGINT and exit 0 (so compose can start the
    others on ``service_healthy``: podman-compose cannot wait for
    ``service_completed_successfully`` with podman 4.3)."""
    from deploy.tls_certs import TlsCertError

    tls_dir = Path(args.tls_dir)
    if args.check:
        return 0 if _tls_material_complete(tls_dir, args.auth) else 1
    topo = load_topology(args.topology or DEFAULT_TOPOLOGY)
    try:
        create_tls_material(topo, tls_dir)
        auth = ensure_auth_material(tls_dir) if args.auth else None
    except (TlsCertError, OSError) as exc:
        raise GeoError(f"cannot create the TLS material in {tls_dir}: {exc}") from None
    _say(f"geo certs: CA and node certificate in {tls_dir} (clients trust {tls_dir / 'ca.cert.pem'})")
    if auth:
        _say(f"geo certs: token secret key, broker.token (role geo-broker) and admin.token (role geo-admin) in {auth}")
    if args.keep_running:
        stop = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.append(1))
        while not stop:
            signal.pause() if hasattr(signal, "pause") else time.sleep(1)
    return 0


def cmd_broker(args) -> int:
    """``geo broker``: run one broker of a cluster with the settings the topology gives it
    (``--compose``: bind 0.0.0.0, port from ``MINIPULSAR_PORT_<CLUSTER>_<i>`` when set)."""
    import logging

    from broker.__main__ import serve

    topo = _with_tls_dir(load_topology(args.topology or DEFAULT_TOPOLOGY), args.tls_dir, args.auth_dir)
    if args.compose:
        topo = topo.with_broker_ports()
    try:
        cluster = topo.cluster(args.cluster)
    except KeyError as exc:
        raise GeoError(str(exc.args[0])) from None
    if not 0 <= args.index < len(cluster.brokers):
        raise GeoError(f"cluster {args.cluster} has {len(cluster.brokers)} broker(s): --index 0..{len(cluster.brokers) - 1}")
    config = topo.broker_config(args.cluster, args.index, args.data_dir,
                                bind_address="0.0.0.0" if args.compose else None)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if topo.auth_dir:
        from deploy.geo_auth import token_role
        _say(f"geo broker: authentication and authorization on; own role {token_role(Path(topo.auth_dir) / 'broker.token')} "
             f"(a superuser) towards the bookies, the other brokers and the remote clusters (replicators)")
    run_async(serve(config))
    return 0


def cmd_probe(args) -> int:
    """``geo probe etcd|bookie|broker HOST:PORT [--tls-dir DIR] [--auth-dir AUTH]``: exit 0
    when it answers (health checks): etcd's ``/health``, a bookie's port, a broker's admin
    health call. With ``--tls-dir`` (the TLS stack): a TLS handshake with the bookie presenting
    the node certificate (mutual TLS), the broker's health call over ``minipulsar+ssl://``.
    With ``--auth-dir`` (tokens of ``geo up --auth``): the broker's health call with the
    administrator's token; the bookie must then also answer ``GetBookieInfo`` to the brokers'
    role (so a bookie refusing the brokers' token is unhealthy)."""
    from deploy.geo_auth import admin_authentication

    host, _, port = args.address.rpartition(":")
    tls_dir = getattr(args, "tls_dir", None)
    auth_dir = getattr(args, "auth_dir", None)
    if auth_dir and missing_auth_files(auth_dir):
        return 1
    if tls_dir and args.kind == "bookie":
        if not _tls_handshake(host or "127.0.0.1", int(port), Path(tls_dir), args.timeout):
            return 1
        return 0 if not auth_dir or _bookie_info(args.address, Path(tls_dir), auth_dir, args.timeout) else 1
    if args.kind == "etcd":
        from deploy.cluster import etcd_healthy

        return 0 if etcd_healthy(int(port), host or "127.0.0.1", args.timeout) else 1
    if args.kind == "bookie":
        return 0 if _port_open(host or "127.0.0.1", int(port), args.timeout) else 1

    auth = admin_authentication(auth_dir) if auth_dir else None

    async def check() -> bool:
        """True when the broker's admin health call answers ``ok`` within ``--timeout`` seconds."""
        from client.admin import AdminClient

        if tls_dir:
            admin = AdminClient(f"minipulsar+ssl://{args.address}", operation_timeout_seconds=args.timeout,
                                tls_trust_certs_file_path=str(Path(tls_dir) / "ca.cert.pem"), authentication=auth)
        else:
            admin = AdminClient(f"minipulsar://{args.address}", operation_timeout_seconds=args.timeout,
                                authentication=auth)
        try:
            return bool((await asyncio.wait_for(admin.health(), args.timeout)).get("ok"))
        except Exception:   # noqa: BLE001 - any failure = unhealthy
            return False
        finally:
            await admin.close()
    return 0 if asyncio.run(check()) else 1


H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + empty SETTINGS


def _tls_handshake(host: str, port: int, tls_dir: Path, timeout: float) -> bool:
    """True when ``host:port`` answers gRPC over TLS: the handshake (ALPN h2) succeeds with
    the server's certificate checked against ``tls_dir``'s CA and the node certificate
    presented, and the server then sends its HTTP/2 SETTINGS frame (with TLS 1.3 a server
    refusing the client certificate only says so after the client's handshake ends)."""
    import ssl

    try:
        ctx = ssl.create_default_context(cafile=str(tls_dir / "ca.cert.pem"))
        ctx.load_cert_chain(str(tls_dir / "node.cert.pem"), str(tls_dir / "node.key.pem"))
        ctx.set_alpn_protocols(["h2"])
        with socket.create_connection((host, port), timeout=timeout) as raw:
            with ctx.wrap_socket(raw, server_hostname=host) as conn:
                conn.sendall(H2_PREFACE)
                header = b""
                while len(header) < 9:
                    chunk = conn.recv(9 - len(header))
                    if not chunk:
                        return False
                    header += chunk
                return header[3] == 4   # frame type SETTINGS
    except (OSError, ssl.SSLError, ValueError):
        return False


def _bookie_info(address: str, tls_dir: Path, auth_dir: str, timeout: float) -> bool:
    """True when the bookie at ``address`` answers ``GetBookieInfo`` over mutual TLS (the node
    certificate of ``tls_dir``) to the brokers' role (``auth_dir/broker.token``)."""
    import grpc

    from deploy.geo_auth import broker_authentication
    from proto import bookie_pb2 as pb
    from proto import bookie_pb2_grpc as pbg
    from proto.channels import ChannelSecurity, open_channel

    async def call() -> bool:
        channel = open_channel(address, [], ChannelSecurity(
            tls=True, tls_trust_certs_file_path=str(tls_dir / "ca.cert.pem"),
            tls_certificate_file_path=str(tls_dir / "node.cert.pem"), tls_key_file_path=str(tls_dir / "node.key.pem"),
            authentication=broker_authentication(auth_dir)))
        try:
            await pbg.BookieStub(channel).GetBookieInfo(pb.BookieInfoRequest(), timeout=timeout)
            return True
        except grpc.aio.AioRpcError:
            return False
        finally:
            await channel.close()
    return asyncio.run(call())


def add_container_arguments(sub) -> None:
    """The ``setup``, ``broker``, ``probe`` and ``certs`` actions on the ``geo`` subparsers ``sub``."""
    setup = sub.add_parser("setup", help="only register clusters/tenants/namespaces/topics (brokers running)")
    setup.add_argument("--topology", metavar="FILE", help="topology TOML (default deploy/geo.toml)")
    setup.add_argument("--compose", action="store_true",
                       help="in docker-compose: broker ports moved by MINIPULSAR_PORT_<CLUSTER>_<i>")
    setup.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the brokers (default 120)")
    setup.add_argument("--tls-dir", metavar="DIR", help="over TLS with the CA and node certificate of DIR (geo certs)")
    setup.add_argument("--auth-dir", metavar="AUTH", help="with the administrator's token of AUTH (geo certs --auth)")
    setup.set_defaults(geo_func=cmd_setup)
    broker = sub.add_parser("broker", help="run one broker of a cluster from the topology (containers)")
    broker.add_argument("--topology", metavar="FILE", help="topology TOML (default deploy/geo.toml)")
    broker.add_argument("--cluster", required=True)
    broker.add_argument("--index", type=int, default=0, help="which broker of the cluster (default 0)")
    broker.add_argument("--data-dir", default="/data", help="the broker's data directory (default /data)")
    broker.add_argument("--compose", action="store_true",
                        help="bind 0.0.0.0 (advertise the topology's host); port from MINIPULSAR_PORT_<CLUSTER>_<i>")
    broker.add_argument("--log-level", default="INFO")
    broker.add_argument("--tls-dir", metavar="DIR", help="TLS as `geo up --tls`, with the CA and node certificate "
                                                         "of DIR (geo certs)")
    broker.add_argument("--auth-dir", metavar="AUTH", help="token authentication and authorization as `geo up "
                                                           "--auth`, with the key and tokens of AUTH (geo certs --auth)")
    broker.set_defaults(geo_func=cmd_broker)
    probe = sub.add_parser("probe", help="exit 0 when an etcd/bookie/broker answers (health checks)")
    probe.add_argument("kind", choices=["etcd", "bookie", "broker"])
    probe.add_argument("address", help="HOST:PORT")
    probe.add_argument("--timeout", type=float, default=3.0)
    probe.add_argument("--tls-dir", metavar="DIR", help="speak TLS (bookies: present DIR's node certificate)")
    probe.add_argument("--auth-dir", metavar="AUTH", help="present AUTH's tokens (brokers: the administrator's; "
                                                          "bookies: the brokers', with --tls-dir)")
    probe.set_defaults(geo_func=cmd_probe)
    certs = sub.add_parser("certs", help="create the demo CA and node certificate in --tls-dir once (containers)")
    certs.add_argument("--tls-dir", required=True, metavar="DIR", help="where ca.cert.pem, node.cert.pem ... go")
    certs.add_argument("--topology", metavar="FILE", help="topology TOML (default deploy/geo.toml): its host is a SAN")
    certs.add_argument("--check", action="store_true", help="create nothing: exit 0 when the files are there and load")
    certs.add_argument("--auth", action="store_true", help="also the token key and tokens of `geo up --auth` in "
                                                           "--tls-dir/auth (the TLS compose stack)")
    certs.add_argument("--keep-running", action="store_true",
                       help="then keep running until SIGTERM (a compose service others wait for, healthy)")
    certs.set_defaults(geo_func=cmd_certs)
