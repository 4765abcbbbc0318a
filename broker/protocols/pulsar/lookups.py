"""LOOKUP / PARTITIONED_METADATA / GET_TOPICS_OF_NAMESPACE / GET_SCHEMA /
GET_OR_CREATE_SCHEMA of one connection (Pulsar's ServerCnx lookup handlers) over
``BrokerService.lookup`` / ``partitions_of`` / ``list_topics`` and the schema
registry. Lookup answers name ``pulsar://`` URLs: this broker's own, or in a
broker cluster the owner's (or the broker to ask, as a Redirect), read from the
listener registration of that broker (``registry.pulsar_urls_of``)."""
from __future__ import annotations

import logging

from proto.errors import ServiceNotReady
from proto.pulsar_wire_pb2 import (BaseCommand, CommandGetTopicsOfNamespace, CommandLookupTopicResponse,
                                   CommandPartitionedTopicMetadataResponse)
from proto.topic_name import TopicName

from .registry import pulsar_urls_of
from .schemas import SchemaRegistry
from .server_errors import server_error

log = logging.getLogger(__name__)
T = BaseCommand.Type


class LookupCommands:
    """Lookups and schema commands of one PulsarConnection."""

    def __init__(self, conn):
        self.conn = conn
        registry = getattr(conn.service, "pulsar_schema_registry", None)
        if registry is None:
            registry = SchemaRegistry(conn.service)
            conn.service.pulsar_schema_registry = registry
        self.schemas: SchemaRegistry = registry

    def handlers(self) -> dict:
        """Command type -> handler(cmd, payload)."""
        spawn = self.conn.spawn
        return {
            T.LOOKUP: lambda cmd, _: spawn(self._lookup(cmd.lookupTopic)),
            T.PARTITIONED_METADATA: lambda cmd, _: spawn(self._partitions(cmd.partitionMetadata)),
            T.GET_TOPICS_OF_NAMESPACE: lambda cmd, _: spawn(self._topics(cmd.getTopicsOfNamespace)),
            T.GET_SCHEMA: lambda cmd, _: spawn(self._get_schema(cmd.getSchema)),
            T.GET_OR_CREATE_SCHEMA: lambda cmd, _: spawn(self._get_or_create_schema(cmd.getOrCreateSchema)),
        }

    async def _lookup(self, q) -> None:
        conn = self.conn
        R = CommandLookupTopicResponse
        try:
            TopicName.get(q.topic)
            await conn.check_topic(q.topic, "lookup")
            answer = await conn.service.lookup(q.topic, q.authoritative)
            if answer.broker_service_url == conn.service.service_url:
                url, url_tls = conn.pulsar_url, conn.pulsar_url_tls
            else:
                url, url_tls = await pulsar_urls_of(conn.service, answer.broker_service_url)
                if not url:
                    raise ServiceNotReady(f"broker {answer.broker_service_url} owning {q.topic} has no Pulsar "
                                          f"protocol listener registered; retry")
            # proxy_through_service_url (a standalone broker): the client keeps using the address it
            # connected to (ports forwarded, a TCP proxy) with this broker's URL as logical address
            response = {"request_id": q.request_id, "response": R.Redirect if answer.redirect else R.Connect,
                        "authoritative": answer.authoritative, "brokerServiceUrl": url or url_tls,
                        "proxy_through_service_url": answer.proxy_through_service_url}
            if url_tls:
                response["brokerServiceUrlTls"] = url_tls
        except Exception as exc:  # noqa: BLE001 - answered to the client
            code, message = server_error(exc)
            response = {"request_id": q.request_id, "response": R.Failed, "error": code, "message": message}
        conn.write_command(BaseCommand(type=T.LOOKUP_RESPONSE, lookupTopicResponse=response))

    async def _partitions(self, q) -> None:
        conn = self.conn
        R = CommandPartitionedTopicMetadataResponse
        try:
            TopicName.get(q.topic)
            await conn.check_topic(q.topic, "lookup")
            response = {"request_id": q.request_id, "response": R.Success,
                        "partitions": await conn.service.partitions_of(q.topic)}
        except Exception as exc:  # noqa: BLE001 - answered to the client
            code, message = server_error(exc)
            response = {"request_id": q.request_id, "response": R.Failed, "error": code, "message": message}
        conn.write_command(BaseCommand(type=T.PARTITIONED_METADATA_RESPONSE, partitionMetadataResponse=response))

    async def _topics(self, q) -> None:
        conn = self.conn
        try:
            if q.mode == CommandGetTopicsOfNamespace.NON_PERSISTENT:
                topics = []                        # minipulsar has persistent topics only
            else:
                security = conn.security
                if security is not None:
                    await security.check_namespace_read(conn.who, q.namespace)
                topics = await conn.service.list_topics(q.namespace)
        except Exception as exc:  # noqa: BLE001 - answered to the client
            conn.send_error(q.request_id, exc)
            return
        conn.write_command(BaseCommand(type=T.GET_TOPICS_OF_NAMESPACE_RESPONSE, getTopicsOfNamespaceResponse={
            "request_id": q.request_id, "topics": topics, "filtered": False, "changed": True}))

    async def _get_schema(self, q) -> None:
        conn = self.conn
        try:
            await conn.check_topic(q.topic, "lookup")
            schema, version = await self.schemas.get(q.topic, q.schema_version if q.HasField("schema_version")
                                                     else None)
        except Exception as exc:  # noqa: BLE001 - answered to the client
            code, message = server_error(exc)
            conn.write_command(BaseCommand(type=T.GET_SCHEMA_RESPONSE, getSchemaResponse={
                "request_id": q.request_id, "error_code": code, "error_message": message}))
            return
        response = {"request_id": q.request_id}
        if schema is None:
            from proto.pulsar_wire_pb2 import ServerError
            response.update(error_code=ServerError.TopicNotFound, error_message=f"no schema on {q.topic}")
        else:
            response.update(schema=schema, schema_version=version)
        conn.write_command(BaseCommand(type=T.GET_SCHEMA_RESPONSE, getSchemaResponse=response))

    async def _get_or_create_schema(self, q) -> None:
        conn = self.conn
        try:
            await conn.check_topic(q.topic, "produce")
            version = await self.schemas.get_or_create(q.topic, q.schema)
            response = {"request_id": q.request_id, "schema_version": version}
        except Exception as exc:  # noqa: BLE001 - answered to the client
            code, message = server_error(exc)
            response = {"request_id": q.request_id, "error_code": code, "error_message": message}
        conn.write_command(BaseCommand(type=T.GET_OR_CREATE_SCHEMA_RESPONSE, getOrCreateSchemaResponse=response))
