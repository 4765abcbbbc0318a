"""``minipulsar-admin``: administer clusters, tenants, namespaces and topics,
with Pulsar's ``pulsar-admin`` verbs and argument shapes.

    minipulsar-admin clusters create us-west --url minipulsar://10.0.0.2:6600
    minipulsar-admin tenants create acme --allowed-clusters us-west,us-east
    minipulsar-admin namespaces create acme/orders
    minipulsar-admin namespaces set-clusters acme/orders --clusters us-west,us-east
    minipulsar-admin topics create-partitioned-topic persistent://acme/orders/o -p 4
    minipulsar-admin topics update-partitioned-topic persistent://acme/orders/o -p 8
    minipulsar-admin topics stats persistent://acme/orders/o --json
    minipulsar-admin topics reset-cursor my-topic -s my-sub -t 10m

Clusters that share a configuration store (Pulsar's
configurationMetadataStoreUrl; the geo demo's) see one set of clusters,
tenants, namespaces and policies: a change made once, against any of them,
applies to all.  Without one, each cluster keeps its own metadata and a call
changes only the cluster whose broker it is sent to.  To apply the same
change to several such clusters, repeat
``--service-url`` or give a comma-separated list; the command then runs
against each of them in turn, prints each cluster's answer under a
``== <url> ==`` header (``--json``: one object ``{url: answer}``), goes on
after a failure and exits with status 1 if any cluster failed.

Output is a readable table by default and JSON with ``--json`` (for
scripts; one JSON document on stdout).  An error prints one line
``error: <message>`` on stderr (the message says what to do) and exits with
status 1; bad arguments exit with 2.  ``--service-url`` (alias
``--admin-url``) defaults to ``$MINIPULSAR_SERVICE_URL`` or
``minipulsar://127.0.0.1:6600``; options may come before or after the verb.

To add a verb: a ``_cmd_<group>_<verb>(admin, args)`` coroutine calling
``client.admin.AdminClient`` and an ``add_parser`` line in ``build_parser``.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any

from client.cli import DEFAULT_SERVICE_URL, SERVICE_URL_ENV, CliError, add_tls_arguments, default_service_url, \
    error_line, run_main, tls_kwargs

__all__ = ["main", "build_parser", "render", "parse_reset_time", "split_list", "service_urls"]

_HELP_EPILOG = f"""\
Clusters sharing a configuration store (--configuration-metadata-store-url of
their brokers, as in the geo demo) see every tenant and namespace change made
once.  Otherwise each cluster keeps its own metadata: a call changes only the
cluster it is sent to; repeat --service-url (or give a comma-separated list)
to apply the same change to several clusters, e.g.:

  minipulsar-admin --service-url minipulsar://a:6600,minipulsar://b:6600 \\
      namespaces set-clusters acme/orders --clusters a,b

Several brokers of ONE cluster are listed after one scheme (any live one
answers): --service-url minipulsar://a1:6600,a2:6600.

--service-url defaults to ${SERVICE_URL_ENV} or {DEFAULT_SERVICE_URL}.
Errors print "error: <message>" and exit with status 1.
"""


# ---------------------------------------------------------------------------- small helpers
def split_list(text: str) -> list[str]:
    """``"a,b, c"`` -> ``["a", "b", "c"]`` (empty items dropped)."""
    return [item.strip() for item in text.split(",") if item.strip()]


def service_urls(values: list[str] | None) -> list[str]:
    """The service URLs of ``--service-url`` values (repeatable, comma-separated),
    de-duplicated in order; the default when none was given.  An item without
    a scheme continues the URL before it as one more host of the same cluster:
    ``minipulsar://a:1,b:2,minipulsar://c:3`` is two clusters, the first one
    with hosts a:1 and b:2 (``minipulsar://a:1,b:2``)."""
    urls: list[str] = []
    for value in values or [default_service_url()]:
        grouped: list[str] = []
        for item in split_list(value):
            if "://" not in item and grouped:
                grouped[-1] += "," + item      # one more host of the cluster before it
            else:
                grouped.append(item)
        for url in grouped:
            if url not in urls:
                urls.append(url)
    if not urls:
        raise CliError("--service-url is empty: give minipulsar://host:port")
    return urls


_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)$", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_reset_time(text: str, now_ms: int | None = None) -> int:
    """reset-cursor's ``-t``: an absolute time in ms since the epoch (digits
    only), or a time relative to now such as ``30s``, ``10m``, ``2h``, ``1d``,
    ``1w`` (that long ago).  Returns ms since the epoch; raises ``CliError``."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    value = text.strip()
    if value.isdigit():
        return int(value)
    m = _RELATIVE.match(value)
    if not m:
        raise CliError(f"bad time {text!r}: give ms since the epoch (e.g. 1700000000000) or a relative time "
                       f"such as 30s, 10m, 2h, 1d")
    return now_ms - int(float(m.group(1)) * _UNIT_MS[m.group(2).lower()])


def _parse_message_id(text: str) -> str:
    parts = text.strip().split(":")
    if len(parts) < 2 or not all(re.fullmatch(r"-?\d+", p) for p in parts[:2]):
        raise CliError(f"bad message id {text!r}: use LEDGER:ENTRY, e.g. 12:0")
    return f"{parts[0]}:{parts[1]}"


# ---------------------------------------------------------------------------- rendering
def _scalar(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    if isinstance(value, (list, tuple)):
        return ", ".join(_scalar(v) for v in value) if value else "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_scalar(v)}" for k, v in value.items()) if value else "-"
    return str(value)


def _table(rows: list[list[str]], header: list[str] | None = None) -> list[str]:
    all_rows = ([header] if header else []) + rows
    if not all_rows:
        return []
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(all_rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in all_rows]
    if header:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _is_record_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _is_record_map(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(isinstance(v, dict) for v in value.values())


def _records_table(records: list[dict], first: str | None = None, names: list[str] | None = None) -> list[str]:
    columns: list[str] = []
    for rec in records:
        for key, v in rec.items():
            if key not in columns and not _is_record_list(v) and not _is_record_map(v):
                columns.append(key)
    header = ([first] if first else []) + columns
    rows = [([names[i]] if names else []) + [_scalar(rec.get(c)) for c in columns] for i, rec in enumerate(records)]
    return _table(rows, header)


def render(value: Any, indent: str = "") -> str:
    """Readable text of an admin answer: a list of names one per line, a dict
    as aligned ``key  value`` lines, nested maps of records (subscriptions,
    cursors) and lists of records (ledgers, publishers, consumers) as tables
    under a ``key:`` heading."""
    lines: list[str] = []
    if value is None:
        return ""
    if isinstance(value, list):
        if _is_record_list(value):
            lines.extend(_records_table(value))
        else:
            lines.extend(_scalar(v) for v in value)
        return "\n".join(indent + line for line in lines)
    if not isinstance(value, dict):
        return indent + _scalar(value)
    if _is_record_map(value) and all(not _is_record_map(v) for v in value.values()):
        names = list(value)  # e.g. a partition's subscriptions: one row per name
        return "\n".join(indent + line for line in _records_table([value[n] for n in names], "name", names))
    simple = [[str(k), _scalar(v)] for k, v in value.items() if not _is_record_list(v) and not _is_record_map(v)]
    lines.extend(_table(simple))
    for key, v in value.items():
        if _is_record_map(v):
            names = list(v)
            lines.append("")
            lines.append(f"{key}:")
            lines.extend("  " + line for line in _records_table([v[n] for n in names], "name", names))
            for name in names:  # nested record lists, e.g. a subscription's consumers
                for sub_key, sub_v in v[name].items():
                    if _is_record_list(sub_v) or _is_record_map(sub_v):
                        lines.append(f"  {key}[{name}].{sub_key}:")
                        lines.extend("    " + line for line in render(sub_v).splitlines())
        elif _is_record_list(v):
            lines.append("")
            lines.append(f"{key}:")
            lines.extend("  " + line for line in _records_table(v))
    return "\n".join(indent + line for line in lines)


# ---------------------------------------------------------------------------- verbs
# Each returns (answer, text): ``answer`` is what --json prints, ``text`` the
# readable form (None: render(answer)).
def _cluster_auth_params(args) -> str | None:
    """``--auth-token T`` as ``token:T``, else ``--auth-parameters`` (None: not given)."""
    token = getattr(args, "auth_token", None)
    if token:
        return token if token.startswith(("token:", "file:")) else f"token:{token}"
    return getattr(args, "auth_parameters", None)


async def _clusters_create(a, args):
    await a.create_cluster(args.name, args.url, args.url_secure, getattr(args, "auth_plugin", None),
                           _cluster_auth_params(args))
    return {"ok": True, "cluster": args.name, "service_url": args.url}, f"cluster {args.name} created ({args.url})"


async def _clusters_list(a, args):
    return await a.list_clusters(), None


async def _clusters_get(a, args):
    return await a.get_cluster(args.name), None


async def _clusters_update(a, args):
    await a.update_cluster(args.name, args.url, args.url_secure, getattr(args, "auth_plugin", None),
                           _cluster_auth_params(args))
    return {"ok": True, "cluster": args.name, "service_url": args.url}, f"cluster {args.name} updated ({args.url})"


async def _clusters_delete(a, args):
    await a.delete_cluster(args.name)
    return {"ok": True, "cluster": args.name}, f"cluster {args.name} deleted"


async def _tenants_create(a, args):
    clusters = split_list(args.allowed_clusters) if args.allowed_clusters else None
    roles = split_list(args.admin_roles) if getattr(args, "admin_roles", None) else None
    await a.create_tenant(args.tenant, clusters, roles)
    info = await a.get_tenant(args.tenant)
    return ({"ok": True, "tenant": args.tenant, **info},
            f"tenant {args.tenant} created (allowed clusters: {_scalar(info.get('allowed_clusters'))})")


async def _tenants_list(a, args):
    return await a.list_tenants(), None


async def _tenants_get(a, args):
    return await a.get_tenant(args.tenant), None


async def _tenants_update(a, args):
    clusters = split_list(args.allowed_clusters)
    roles = split_list(args.admin_roles) if getattr(args, "admin_roles", None) is not None else None
    await a.update_tenant(args.tenant, clusters, roles)
    return ({"ok": True, "tenant": args.tenant, "allowed_clusters": clusters},
            f"tenant {args.tenant} updated (allowed clusters: {_scalar(clusters)})")


async def _tenants_delete(a, args):
    await a.delete_tenant(args.tenant)
    return {"ok": True, "tenant": args.tenant}, f"tenant {args.tenant} deleted"


async def _ns_create(a, args):
    await a.create_namespace(args.namespace)
    return {"ok": True, "namespace": args.namespace}, f"namespace {args.namespace} created"


async def _ns_list(a, args):
    return await a.list_namespaces(args.tenant), None


async def _ns_policies(a, args):
    return await a.get_policies(args.namespace), None


async def _ns_delete(a, args):
    await a.delete_namespace(args.namespace)
    return {"ok": True, "namespace": args.namespace}, f"namespace {args.namespace} deleted"


async def _ns_set_dedup(a, args):
    policies = await a.set_deduplication(args.namespace, args.enable)
    state = "enabled" if args.enable else "disabled"
    return policies, f"deduplication {state} on {args.namespace}"


async def _ns_set_clusters(a, args):
    clusters = split_list(args.clusters)
    policies = await a.set_namespace_clusters(args.namespace, clusters)
    return policies, f"replication clusters of {args.namespace}: {_scalar(clusters)}"


async def _ns_set_ttl(a, args):
    policies = await a.set_message_ttl(args.namespace, args.ttl)
    return policies, f"message TTL of {args.namespace}: {args.ttl} s"


async def _ns_set_retention(a, args):
    policies = await a.set_retention(args.namespace, args.time, args.size)
    return policies, f"retention of {args.namespace}: {args.time} minutes, {args.size} MB"


async def _topics_create(a, args):
    await a.create_topic(args.topic)
    return {"ok": True, "topic": args.topic}, f"topic {args.topic} created"


async def _topics_create_partitioned(a, args):
    await a.create_partitioned_topic(args.topic, args.partitions)
    return ({"ok": True, "topic": args.topic, "partitions": args.partitions},
            f"partitioned topic {args.topic} created with {args.partitions} partitions")


async def _topics_update_partitioned(a, args):
    result = await a.update_partitioned_topic(args.topic, args.partitions)
    previous = result.get("previous", args.partitions)
    text = (f"partitioned topic {args.topic} now has {args.partitions} partitions (was {previous})"
            if previous != args.partitions else f"partitioned topic {args.topic} already has {previous} partitions")
    return {"ok": True, "topic": args.topic, "partitions": args.partitions, "previous": previous}, text


async def _topics_list(a, args):
    return await a.list_topics(args.namespace), None


async def _topics_list_partitioned(a, args):
    return await a.list_partitioned_topics(args.namespace), None


async def _topics_stats(a, args):
    return await a.get_stats(args.topic), None


async def _topics_internal_stats(a, args):
    return await a.get_internal_stats(args.topic), None


async def _topics_delete(a, args):
    await a.delete_topic(args.topic, force=args.force)
    return {"ok": True, "topic": args.topic}, f"topic {args.topic} deleted"


async def _topics_unload(a, args):
    await a.unload_topic(args.topic)
    return {"ok": True, "topic": args.topic}, f"topic {args.topic} unloaded"


async def _topics_subscriptions(a, args):
    return await a.get_subscriptions(args.topic), None


async def _topics_unsubscribe(a, args):
    await a.unsubscribe(args.topic, args.subscription)
    return ({"ok": True, "topic": args.topic, "subscription": args.subscription},
            f"subscription {args.subscription} of {args.topic} deleted")


async def _topics_reset_cursor(a, args):
    if args.message_id is not None:
        result = await a.reset_cursor(args.topic, args.subscription, message_id=_parse_message_id(args.message_id))
        target = f"message id {args.message_id}"
    else:
        ts = parse_reset_time(args.time)
        result = await a.reset_cursor(args.topic, args.subscription, timestamp_ms=ts)
        target = f"publish time {ts} ({time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ts / 1000))})"
    return result, (f"subscription {args.subscription} of {args.topic} reset to {target}: "
                    f"position {result.get('position', '?')}")


async def _topics_partitioned_metadata(a, args):
    partitions = await a.get_partitioned_topic_metadata(args.topic)
    return {"partitions": partitions}, None


async def _topics_set_replication_clusters(a, args):
    clusters = split_list(args.clusters)
    result = await a.set_replication_clusters(args.topic, clusters)
    return result, f"replication clusters of {args.topic}: {_scalar(clusters)}"


async def _brokers_health(a, args):
    return await a.health(), None


async def _brokers_list(a, args):
    brokers = await a.list_brokers()
    rows = [{"broker": b.get("service_url"), "leader": b.get("leader", False), "bundles": len(b.get("bundles", {})),
             "topics": b.get("topics"), "msgRateIn": b.get("msg_rate_in"), "msgRateOut": b.get("msg_rate_out"),
             "cpu%": b.get("cpu")} for b in brokers]
    return brokers, render(rows)


async def _brokers_leader(a, args):
    answer = await a.leader_broker()
    return answer, answer.get("service_url")


async def _topics_lookup(a, args):
    answer = await a.lookup_topic(args.topic)
    return answer, answer.get("broker_url")


async def _ns_bundles(a, args):
    answer = await a.get_bundles(args.namespace)
    rows = [{"bundle": r, "owner": o} for r, o in answer.get("owners", {}).items()]
    return answer, render(rows)


async def _ns_unload(a, args):
    answer = await a.unload_namespace(args.namespace, args.bundle)
    done = answer.get("unloaded", {})
    what = f"bundle {args.bundle} of {args.namespace}" if args.bundle else f"namespace {args.namespace}"
    return answer, (f"unloaded {what}: " + (", ".join(f"{r} ({n} topics)" for r, n in done.items())
                                            if done else "no bundle was owned"))


async def _ns_split_bundle(a, args):
    answer = await a.split_bundle(args.namespace, args.bundle)
    return answer, f"bundle {args.bundle} of {args.namespace} split into {_scalar(answer.get('bundles'))}"


# ---------------------------------------------------------------------------- running
async def _ns_grant(a, args):
    actions = split_list(args.actions)
    answer = await a.grant_namespace_permission(args.namespace, args.role, actions)
    return answer, f"granted {','.join(actions)} on {args.namespace} to role {args.role}"


async def _ns_revoke(a, args):
    answer = await a.revoke_namespace_permission(args.namespace, args.role)
    return answer, f"revoked the permissions of role {args.role} on {args.namespace}"


async def _ns_permissions(a, args):
    return await a.get_namespace_permissions(args.namespace), None


async def _ns_grant_sub(a, args):
    roles = split_list(args.roles)
    answer = await a.grant_subscription_permission(args.namespace, args.subscription, roles)
    return answer, f"subscription {args.subscription} of {args.namespace} reserved to role(s) {','.join(roles)}"


async def _ns_revoke_sub(a, args):
    answer = await a.revoke_subscription_permission(args.namespace, args.subscription, args.role)
    return answer, f"role {args.role} removed from subscription {args.subscription} of {args.namespace}"


async def _topics_grant(a, args):
    actions = split_list(args.actions)
    answer = await a.grant_topic_permission(args.topic, args.role, actions)
    return answer, f"granted {','.join(actions)} on {args.topic} to role {args.role}"


async def _topics_revoke(a, args):
    answer = await a.revoke_topic_permission(args.topic, args.role)
    return answer, f"revoked the topic permissions of role {args.role} on {args.topic}"


async def _topics_permissions(a, args):
    return await a.get_topic_permissions(args.topic), None


def _explain(exc: BaseException, url: str, timeout: float) -> str:
    """The error line; an unreachable broker gets a hint instead of a bare gRPC status."""
    from client.errors import ConnectError, Timeout
    if getattr(exc, "unreachable", None) or getattr(exc, "tls_problem", False):  # error_line says it all
        return error_line(exc)
    if isinstance(exc, (ConnectError, Timeout)):
        return (f"no answer from the broker at {url} within {timeout:g} s ({error_line(exc)}); check "
                f"--service-url (or ${SERVICE_URL_ENV}) and that the broker is running")
    return error_line(exc)


async def _run(args) -> int:
    from client.admin import AdminClient

    urls = service_urls(args.service_url)
    answers: dict[str, Any] = {}
    failed = 0
    for url in urls:
        header = f"== {url} ==" if len(urls) > 1 else None
        try:
            from client.auth import authentication_from_params
            authentication = authentication_from_params(getattr(args, "auth_plugin_global", None),
                                                        getattr(args, "auth_params", None))
            async with AdminClient(url, operation_timeout_seconds=args.timeout, authentication=authentication,
                                   **tls_kwargs(args)) as admin:
                answer, text = await args.func(admin, args)
        except Exception as exc:  # noqa: BLE001 - one line per failed cluster, go on with the others
            from client.errors import PulsarException
            if not isinstance(exc, (PulsarException, CliError, OSError)):
                raise
            failed += 1
            prefix = f"{url}: " if len(urls) > 1 else ""
            print(f"error: {prefix}{_explain(exc, url, args.timeout)}", file=sys.stderr, flush=True)
            continue
        answers[url] = answer
        if not args.json:
            if header:
                print(header)
            out = text if text is not None else render(answer)
            if out:
                print(out)
    if args.json and answers:
        doc = answers[urls[0]] if len(urls) == 1 else answers
        print(json.dumps(doc, sort_keys=True))
    sys.stdout.flush()
    return 1 if failed else 0


def _common_options(suppress: bool) -> argparse.ArgumentParser:
    """Options accepted before and after the verb (the verb's copy uses
    SUPPRESS defaults so that it does not reset a value given before it)."""
    p = argparse.ArgumentParser(add_help=False)

    def default(value):
        return argparse.SUPPRESS if suppress else value

    p.add_argument("--service-url", "--admin-url", dest="service_url", action="append", default=default(None),
                   metavar="URL", help=f"broker to send the call to (default ${SERVICE_URL_ENV} or "
                                       f"{DEFAULT_SERVICE_URL}); repeat it or give a comma-separated list to "
                                       f"apply the same call to several clusters")
    p.add_argument("--json", action="store_true", default=default(False), help="print the answer as JSON")
    add_tls_arguments(p, suppress)
    p.add_argument("--timeout", type=float, default=default(30.0), metavar="SECONDS",
                   help="per-call timeout (default 30)")
    p.add_argument("--auth-plugin", dest="auth_plugin_global", default=default(None), metavar="PLUGIN",
                   help="authentication plugin (pulsar-admin's --auth-plugin): AuthenticationToken")
    p.add_argument("--auth-params", dest="auth_params", default=default(None), metavar="PARAMS",
                   help="credentials (pulsar-admin's --auth-params): token:<jwt> or file:///path/to/token")
    return p


def _cluster_auth_options(v: argparse.ArgumentParser) -> None:
    """The replicators' credentials towards a cluster (pulsar-admin clusters create --auth-parameters;
    the plugin is always the token one), with --auth-token as a short form."""
    v.add_argument("--auth-parameters", dest="auth_parameters", default=None, metavar="PARAMS",
                   help="their credentials: token:<jwt> or file:///path/to/token")
    v.add_argument("--auth-token", dest="auth_token", default=None, metavar="JWT",
                   help="same as --auth-parameters token:JWT")


def build_parser() -> argparse.ArgumentParser:
    """The ``minipulsar-admin`` argument parser: groups ``clusters``,
    ``tenants``, ``namespaces``, ``topics``, ``brokers`` and their verbs."""
    common = _common_options(suppress=True)
    parser = argparse.ArgumentParser(
        prog="minipulsar-admin", parents=[_common_options(suppress=False)],
        description="Administer a minipulsar cluster (like pulsar-admin). Each call changes only the "
                    "cluster it is sent to; repeat --service-url to apply it to several clusters.",
        epilog=_HELP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = parser.add_subparsers(dest="group", metavar="GROUP", required=True)

    def group(name: str, help_text: str):
        g = groups.add_parser(name, help=help_text, parents=[common], description=help_text,
                              epilog=_HELP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        return g.add_subparsers(dest="verb", metavar="VERB", required=True)

    def verb(verbs, name: str, func, help_text: str, aliases=()):
        v = verbs.add_parser(name, help=help_text, description=help_text, parents=[common], aliases=list(aliases))
        v.set_defaults(func=func)
        return v

    # clusters
    g = group("clusters", "clusters known to this cluster (for geo-replication)")
    v = verb(g, "create", _clusters_create, "register a cluster and its broker service URL")
    v.add_argument("name", metavar="NAME")
    v.add_argument("--url", "--broker-url", dest="url", required=True, metavar="minipulsar://HOST:PORT")
    _cluster_auth_options(v)
    v.add_argument("--broker-url-secure", "--url-secure", dest="url_secure", default=None,
                   metavar="minipulsar+ssl://HOST:PORT",
                   help="the cluster's TLS URL (Pulsar's brokerServiceUrlTls), used by replicators of brokers "
                        "with broker_client_tls_enabled")
    verb(g, "list", _clusters_list, "list the clusters")
    verb(g, "get", _clusters_get, "show a cluster").add_argument("name", metavar="NAME")
    v = verb(g, "update", _clusters_update, "change a cluster's service URL (and the replicators' credentials)")
    v.add_argument("name", metavar="NAME")
    v.add_argument("--url", "--broker-url", dest="url", required=True, metavar="minipulsar://HOST:PORT")
    _cluster_auth_options(v)
    v.add_argument("--broker-url-secure", "--url-secure", dest="url_secure", default=None,
                   metavar="minipulsar+ssl://HOST:PORT", help="the cluster's TLS URL (brokerServiceUrlTls)")
    verb(g, "delete", _clusters_delete, "remove a cluster").add_argument("name", metavar="NAME")

    # tenants
    g = group("tenants", "tenants")
    v = verb(g, "create", _tenants_create, "create a tenant")
    v.add_argument("tenant", metavar="TENANT")
    v.add_argument("--allowed-clusters", "-c", default=None, metavar="A,B",
                   help="clusters the tenant may use (default: this cluster)")
    v.add_argument("--admin-roles", "-r", default=None, metavar="R1,R2", help="roles administering the tenant")
    verb(g, "list", _tenants_list, "list the tenants")
    verb(g, "get", _tenants_get, "show a tenant").add_argument("tenant", metavar="TENANT")
    v = verb(g, "update", _tenants_update, "change the clusters a tenant may use")
    v.add_argument("tenant", metavar="TENANT")
    v.add_argument("--allowed-clusters", "-c", required=True, metavar="A,B")
    v.add_argument("--admin-roles", "-r", default=None, metavar="R1,R2",
                   help="roles administering the tenant (default: unchanged)")
    verb(g, "delete", _tenants_delete, "delete a tenant (it must have no namespaces)").add_argument(
        "tenant", metavar="TENANT")

    # namespaces
    g = ns_verbs = group("namespaces", "namespaces, their policies and bundles")
    verb(g, "create", _ns_create, "create a namespace").add_argument("namespace", metavar="TENANT/NAMESPACE")
    verb(g, "list", _ns_list, "list the namespaces of a tenant").add_argument("tenant", metavar="TENANT")
    verb(g, "policies", _ns_policies, "show a namespace's policies").add_argument(
        "namespace", metavar="TENANT/NAMESPACE")
    verb(g, "delete", _ns_delete, "delete a namespace (it must have no topics)").add_argument(
        "namespace", metavar="TENANT/NAMESPACE")
    v = verb(g, "set-deduplication", _ns_set_dedup, "turn broker-side deduplication on or off")
    v.add_argument("namespace", metavar="TENANT/NAMESPACE")
    onoff = v.add_mutually_exclusive_group(required=True)
    onoff.add_argument("--enable", "-e", dest="enable", action="store_true", default=None)
    onoff.add_argument("--disable", "-d", dest="enable", action="store_false")
    v = verb(g, "set-clusters", _ns_set_clusters, "set the namespace's replication clusters")
    v.add_argument("namespace", metavar="TENANT/NAMESPACE")
    v.add_argument("--clusters", "-c", required=True, metavar="A,B")
    v = verb(g, "set-message-ttl", _ns_set_ttl, "set the message TTL (seconds, 0 = none)")
    v.add_argument("namespace", metavar="TENANT/NAMESPACE")
    v.add_argument("--ttl", "-ttl", type=int, required=True, metavar="SECONDS")
    v = verb(g, "set-retention", _ns_set_retention, "set the retention of acknowledged messages")
    v.add_argument("namespace", metavar="TENANT/NAMESPACE")
    v.add_argument("--time", "-t", type=int, required=True, metavar="MINUTES", help="-1 = infinite, 0 = none")
    v.add_argument("--size", "-s", type=int, required=True, metavar="MB", help="-1 = infinite, 0 = none")
    v = verb(g, "grant-permission", _ns_grant, "grant produce/consume on a namespace to a role")
    v.add_argument("namespace", metavar="TENANT/NAMESPACE")
    v.add_argument("--role", required=True, metavar="ROLE")
    v.add_argument("--actions", required=True, metavar="produce,consume", help="functions is accepted and ignored")
    v = verb(g, "revoke-permission", _ns_revoke, "revoke a role's permissions on a namespace")
    v.add_argument("namespace", metavar="TENANT/NAMESPACE")
    v.add_argument("--role", required=True, metavar="ROLE")
    verb(g, "permissions", _ns_permissions, "the roles and actions granted on a namespace").add_argument(
        "namespace", metavar="TENANT/NAMESPACE")
    v = verb(g, "grant-subscription-permission", _ns_grant_sub, "reserve a subscription to some roles")
    v.add_argument("namespace", metavar="TENANT/NAMESPACE")
    v.add_argument("--subscription", "-s", required=True, metavar="SUB")
    v.add_argument("--roles", required=True, metavar="R1,R2")
    v = verb(g, "revoke-subscription-permission", _ns_revoke_sub, "remove a role from a subscription's roles")
    v.add_argument("namespace", metavar="TENANT/NAMESPACE")
    v.add_argument("--subscription", "-s", required=True, metavar="SUB")
    v.add_argument("--role", required=True, metavar="ROLE")

    # topics
    g = group("topics", "topics, subscriptions and stats")
    verb(g, "create", _topics_create, "create a non-partitioned topic").add_argument("topic", metavar="TOPIC")
    v = verb(g, "create-partitioned-topic", _topics_create_partitioned, "create a partitioned topic")
    v.add_argument("topic", metavar="TOPIC")
    v.add_argument("--partitions", "-p", type=int, required=True, metavar="N")
    v = verb(g, "update-partitioned-topic", _topics_update_partitioned,
             "raise the number of partitions of a partitioned topic (never fewer)")
    v.add_argument("topic", metavar="TOPIC")
    v.add_argument("--partitions", "-p", type=int, required=True, metavar="N")
    verb(g, "list", _topics_list, "list the topics of a namespace (partitions individually)").add_argument(
        "namespace", metavar="TENANT/NAMESPACE")
    verb(g, "list-partitioned-topics", _topics_list_partitioned, "list the partitioned topics of a namespace"
         ).add_argument("namespace", metavar="TENANT/NAMESPACE")
    verb(g, "stats", _topics_stats, "topic stats (rates, counters, subscriptions, publishers)").add_argument(
        "topic", metavar="TOPIC")
    verb(g, "internal-stats", _topics_internal_stats, "managed-ledger stats (ledgers, cursors)").add_argument(
        "topic", metavar="TOPIC")
    v = verb(g, "delete", _topics_delete, "delete a topic")
    v.add_argument("topic", metavar="TOPIC")
    v.add_argument("--force", "-f", action="store_true", help="even with connected clients or subscriptions")
    verb(g, "unload", _topics_unload, "unload a topic (clients reconnect)").add_argument("topic", metavar="TOPIC")
    verb(g, "subscriptions", _topics_subscriptions, "list a topic's subscriptions").add_argument(
        "topic", metavar="TOPIC")
    v = verb(g, "unsubscribe", _topics_unsubscribe, "delete a subscription")
    v.add_argument("topic", metavar="TOPIC")
    v.add_argument("--subscription", "-s", required=True, metavar="SUB")
    v = verb(g, "reset-cursor", _topics_reset_cursor, "move a subscription to a message id or a publish time")
    v.add_argument("topic", metavar="TOPIC")
    v.add_argument("--subscription", "-s", required=True, metavar="SUB")
    target = v.add_mutually_exclusive_group(required=True)
    target.add_argument("--messageId", "--message-id", "-m", dest="message_id", metavar="LEDGER:ENTRY")
    target.add_argument("--time", "-t", dest="time", metavar="TIME",
                        help="ms since the epoch, or relative: 30s, 10m, 2h, 1d, 1w ago")
    verb(g, "partitioned-metadata", _topics_partitioned_metadata, "number of partitions (0 = not partitioned)",
         aliases=["get-partitioned-topic-metadata"]).add_argument("topic", metavar="TOPIC")
    v = verb(g, "set-replication-clusters", _topics_set_replication_clusters,
             "topic-level replication clusters (override the namespace's)")
    v.add_argument("topic", metavar="TOPIC")
    v.add_argument("--clusters", "-c", required=True, metavar="A,B")
    v = verb(g, "grant-permission", _topics_grant, "grant produce/consume on a topic to a role")
    v.add_argument("topic", metavar="TOPIC")
    v.add_argument("--role", required=True, metavar="ROLE")
    v.add_argument("--actions", required=True, metavar="produce,consume", help="functions is accepted and ignored")
    v = verb(g, "revoke-permission", _topics_revoke, "revoke a role's permissions on a topic")
    v.add_argument("topic", metavar="TOPIC")
    v.add_argument("--role", required=True, metavar="ROLE")
    verb(g, "permissions", _topics_permissions, "the roles and actions on a topic (namespace's included)"
         ).add_argument("topic", metavar="TOPIC")

    verb(g, "lookup", _topics_lookup, "the broker serving a topic").add_argument("topic", metavar="TOPIC")
    g2 = ns_verbs
    verb(g2, "bundles", _ns_bundles, "a namespace's bundles and their owners").add_argument(
        "namespace", metavar="TENANT/NAMESPACE")
    v = verb(g2, "unload", _ns_unload, "unload a namespace, or one bundle (its topics move to another broker)")
    v.add_argument("namespace", metavar="TENANT/NAMESPACE")
    v.add_argument("--bundle", "-b", default=None, metavar="0xLOWER_0xUPPER")
    v = verb(g2, "split-bundle", _ns_split_bundle, "split a bundle in two")
    v.add_argument("namespace", metavar="TENANT/NAMESPACE")
    v.add_argument("--bundle", "-b", required=True, metavar="0xLOWER_0xUPPER")

    # brokers
    g = group("brokers", "the brokers of the cluster")
    verb(g, "health", _brokers_health, "check the broker's health", aliases=["healthcheck"])
    verb(g, "list", _brokers_list, "the cluster's live brokers with their load")
    verb(g, "leader-broker", _brokers_leader, "the leader broker (runs the load manager)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point of ``minipulsar-admin``; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.timeout <= 0:
        print("error: --timeout must be > 0 seconds", file=sys.stderr)
        return 1
    return run_main(_run, args, "minipulsar-admin")


if __name__ == "__main__":
    sys.exit(main())
