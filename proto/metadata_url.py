"""Metadata store URLs (Pulsar's ``metadataStoreUrl``, BookKeeper's ``metadataServiceUri``),
parsed once for the broker (``broker.metadata.open_metadata_store``, config checks) and
the bookie (registration under ``/ledgers/available``). Pure functions, no I/O.

Accepted forms:

* ``""`` (or None): the embedded SQLite file in the broker's data dir;
* ``sqlite:PATH``: that SQLite file;
* ``etcd://host:port[,host:port...]``: an etcd cluster (port defaults to 2379; IPv6
  hosts in brackets). Pulsar's own spelling ``etcd:http://host:port[,http://host:port]``
  is accepted too.
"""
from __future__ import annotations

import re
from typing import Optional

__all__ = ["ACCEPTED_FORMS", "ETCD_DEFAULT_PORT", "parse_metadata_store_url", "parse_etcd_endpoints"]

ETCD_DEFAULT_PORT = 2379
ACCEPTED_FORMS = '"" (embedded SQLite in the data dir), "sqlite:PATH" or "etcd://host:port[,host:port...]"'
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)$")


def parse_metadata_store_url(url: Optional[str]) -> tuple[str, Optional[str]]:
    """``(kind, target)`` of a metadata store URL.

    * ``""`` / None / blanks -> ``("sqlite", None)`` (the caller's default file);
    * ``"sqlite:PATH"`` -> ``("sqlite", "PATH")``;
    * ``"etcd://h1:p1,h2:p2"`` (or Pulsar's ``"etcd:http://h1:p1,http://h2:p2"``) ->
      ``("etcd", "h1:p1,h2:p2")``, endpoints normalized (default port 2379).

    Raises ValueError naming the accepted forms for anything else (``zk:...``,
    ``rocksdb:...``, an empty SQLite path, a bad host or port).
    """
    if url is None:
        return "sqlite", None
    if not isinstance(url, str):
        raise ValueError(f"metadata store URL must be a string, got {type(url).__name__}")
    text = url.strip()
    if text == "":
        return "sqlite", None
    if text.startswith("sqlite:"):
        path = text[len("sqlite:"):]
        if path.startswith("//"):  # sqlite:///abs/path or sqlite://rel
            path = path[2:]
        if not path.strip():
            raise ValueError(f"metadata store URL {url!r}: sqlite:PATH needs a file path; accepted: {ACCEPTED_FORMS}")
        return "sqlite", path
    if text.startswith("etcd:"):
        endpoints = parse_etcd_endpoints(text)
        return "etcd", ",".join(f"{host}:{port}" for host, port in endpoints)
    raise ValueError(f"unsupported metadata store URL {url!r}: accepted forms are {ACCEPTED_FORMS}")


def parse_etcd_endpoints(url: str) -> list[tuple[str, int]]:
    """``[(host, port), ...]`` of ``etcd://h1:p1[,h2:p2...]`` (or ``etcd:http://h1:p1,http://h2:p2``),
    in the given order, duplicates dropped; port defaults to 2379. Raises ValueError with
    the accepted forms on anything else."""
    if not isinstance(url, str):
        raise ValueError(f"etcd URL must be a string, got {type(url).__name__}")
    text = url.strip()
    if text.startswith("etcd://"):
        body = text[len("etcd://"):]
    elif text.startswith("etcd:"):
        body = text[len("etcd:"):]
    else:
        raise ValueError(f"not an etcd URL: {url!r}; expected etcd://host:port[,host:port...]")
    endpoints: list[tuple[str, int]] = []
    for part in body.split(","):
        item = part.strip()
        for scheme in ("http://", "https://"):
            if item.startswith(scheme):
                if scheme == "https://":
                    raise ValueError(f"etcd URL {url!r}: TLS (https) endpoints are not supported")
                item = item[len(scheme):]
        item = item.rstrip("/")
        if not item:
            raise ValueError(f"etcd URL {url!r} has an empty endpoint; expected etcd://host:port[,host:port...]")
        host, port = _split_host_port(item, url)
        if (host, port) not in endpoints:
            endpoints.append((host, port))
    return endpoints


def _split_host_port(item: str, url: str) -> tuple[str, int]:
    if item.startswith("["):
        close = item.find("]")
        host, rest = item[:close + 1], item[close + 1:]
        port_text = rest[1:] if rest.startswith(":") else ("" if rest == "" else None)
    elif ":" in item:
        host, _, port_text = item.rpartition(":")
    else:
        host, port_text = item, ""
    if port_text is None or not _HOST.match(host or ""):
        raise ValueError(f"etcd URL {url!r}: bad endpoint {item!r}; expected host:port")
    if port_text == "":
        return host, ETCD_DEFAULT_PORT
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"etcd URL {url!r}: bad port in {item!r}; expected a port in 1..65535")
    return host, int(port_text)
