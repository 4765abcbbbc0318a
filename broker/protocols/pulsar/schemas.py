"""A small schema registry per topic (Pulsar's SchemaRegistryService, reduced): the
schemas producers and consumers announce (CommandProducer / CommandSubscribe
``schema``, GET_OR_CREATE_SCHEMA) are kept in the broker's metadata store under
``/schemas/<tenant>/<namespace>/<topic>`` (Pulsar's path; JSON: a list of versions),
partitions sharing their partitioned topic's schema. A version is answered as
Pulsar's 8-byte big-endian long.

Compatibility (Pulsar's default strategy, FULL, for AVRO and JSON record schemas):
a new version may add or drop only fields that have a default (a nullable field, a union
starting with "null" as the Python client writes optional fields, counts as defaulting
to null: more lenient than Avro's own resolution); another schema type
or any other change is refused with IncompatibleSchema. Other types must be equal
to the last version. A topic's first schema is always accepted."""
from __future__ import annotations

import base64
import json
import struct
from typing import Optional

from proto.errors import PulsarException
from proto.pulsar_wire_pb2 import Schema
from proto.topic_name import TopicName

_VERSION = struct.Struct(">q")
SCHEMAS_ROOT = "/schemas"


class IncompatibleSchema(PulsarException):
    """The schema is not compatible with the topic's (Pulsar's IncompatibleSchemaException)."""


def _fields(schema_data: bytes) -> Optional[dict[str, bool]]:
    """name -> has default, of an AVRO/JSON record schema definition; None when unparsable."""
    try:
        definition = json.loads(schema_data or b"{}")
    except ValueError:
        return None
    if not isinstance(definition, dict) or not isinstance(definition.get("fields"), list):
        return None
    out = {}
    for f in definition["fields"]:
        if isinstance(f, dict) and isinstance(f.get("name"), str):
            kind = f.get("type")
            nullable = isinstance(kind, list) and bool(kind) and kind[0] == "null"
            out[f["name"]] = "default" in f or nullable
    return out


def compatible(old: dict, new: Schema) -> bool:
    """FULL compatibility of ``new`` (a wire Schema) against stored version ``old``."""
    old_data = base64.b64decode(old["data"])
    if old["type"] != new.type:
        return False
    if old_data == new.schema_data:
        return True
    if new.type not in (Schema.Avro, Schema.Json):
        return False
    a, b = _fields(old_data), _fields(new.schema_data)
    if a is None or b is None:
        return False
    changed = (set(a) ^ set(b))
    return all((a.get(n) if n in a else b.get(n)) for n in changed)


class SchemaRegistry:
    """Schemas of the topics of one broker's metadata store (``service.metadata``),
    with the last version of each loaded topic cached for PRODUCER_SUCCESS."""

    def __init__(self, service):
        self.service = service
        self._last: dict[str, int] = {}

    @staticmethod
    def _path(topic) -> str:
        tn = TopicName.get(str(topic.name) if hasattr(topic, "name") else str(topic)).partitioned_topic_name
        return f"{SCHEMAS_ROOT}/{tn.tenant}/{tn.namespace_portion}/{tn.local_name}"

    async def _load(self, path: str) -> tuple[list, int]:
        store = self.service.metadata
        got = await store.get(path)
        if got is None:
            return [], -1
        return json.loads(got.value or b"[]"), got.version

    async def get_or_create(self, topic, schema: Schema) -> bytes:
        """The version (8 bytes) of ``schema`` on ``topic``, storing it as a new version
        when compatible; raises IncompatibleSchema. A "None"/bytes schema is not stored."""
        if schema.type == 0:                    # Schema.Type "None": plain bytes
            return _VERSION.pack(max(0, self._last.get(self._path(topic), 0)))
        path = self._path(topic)
        for _ in range(10):
            versions, stat = await self._load(path)
            for i, v in enumerate(versions):
                if v["type"] == schema.type and base64.b64decode(v["data"]) == schema.schema_data:
                    self._last[path] = len(versions) - 1
                    return _VERSION.pack(i)
            if versions and not compatible(versions[-1], schema):
                raise IncompatibleSchema(f"schema {schema.name or ''} of type {Schema.Type.Name(schema.type)} is "
                                         f"not compatible (FULL) with the last version of {topic.name if hasattr(topic, 'name') else topic}")
            versions.append({"type": schema.type, "name": schema.name,
                             "data": base64.b64encode(schema.schema_data).decode(),
                             "properties": {kv.key: kv.value for kv in schema.properties}})
            from broker.metadata.store import BadVersion
            try:
                await self._put(path, versions, stat)
            except BadVersion:
                continue
            self._last[path] = len(versions) - 1
            return _VERSION.pack(len(versions) - 1)
        raise IncompatibleSchema(f"schema of {topic} keeps changing; retry")

    async def _put(self, path: str, versions: list, stat: int) -> None:
        await self.service.metadata.put(path, json.dumps(versions).encode(), stat)

    async def get(self, topic: str, version: Optional[bytes]) -> tuple[Optional[Schema], bytes]:
        """(Schema, version bytes) of ``topic`` (the last one, or ``version``); (None, b"")
        when the topic has none."""
        versions, _ = await self._load(self._path(topic))
        if not versions:
            return None, b""
        index = _VERSION.unpack(version)[0] if version and len(version) == 8 else len(versions) - 1
        if not 0 <= index < len(versions):
            return None, b""
        v = versions[index]
        schema = Schema(name=v.get("name") or "", schema_data=base64.b64decode(v["data"]), type=v["type"])
        for key, value in (v.get("properties") or {}).items():
            schema.properties.add(key=key, value=value)
        return schema, _VERSION.pack(index)

    def version_of(self, topic) -> Optional[bytes]:
        """The last version known for ``topic`` (cached), or None."""
        index = self._last.get(self._path(topic))
        return None if index is None else _VERSION.pack(index)
