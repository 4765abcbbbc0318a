"""Topic names as Pulsar parses them (``org.apache.pulsar.common.naming.TopicName``).

``persistent://tenant/namespace/topic``; a short name ``topic`` resolves to
``persistent://public/default/topic`` and ``tenant/ns/topic`` to
``persistent://tenant/ns/topic``. Partition N of a partitioned topic is
``<topic>-partition-N``.
"""
from __future__ import annotations

import dataclasses
import re

from proto.errors import InvalidTopicName

__all__ = ["TopicName", "PARTITION_SUFFIX"]

PARTITION_SUFFIX = "-partition-"
# fullmatch, not match with "$": "$" also matches before a trailing newline
_NAME_PART = re.compile(r"[-=:.\w]+")
_LOCAL_PART = re.compile(r"[-=:.%\w]+")
_PARTITION = re.compile(r"(.+)-partition-([0-9]+)")     # ASCII digits only ("٣".isdigit() is True)
_PATH_TRICKS = (".", "..")                               # path segments of the metadata store and URLs


@dataclasses.dataclass(frozen=True)
class TopicName:
    """A parsed topic name (immutable). ``partition_index`` is -1 for a non-partition topic."""

    domain: str
    tenant: str
    namespace_portion: str
    local_name: str

    @classmethod
    def get(cls, name: str) -> "TopicName":
        """Parse ``name``; raises InvalidTopicName with what is wrong."""
        if not isinstance(name, str) or not name.strip():
            raise InvalidTopicName(f"invalid topic name {name!r}: empty; use persistent://tenant/namespace/topic")
        original = name
        if "://" not in name:
            parts = name.split("/")
            if len(parts) == 1:
                name = f"persistent://public/default/{name}"
            elif len(parts) == 3:
                name = f"persistent://{name}"
            else:
                raise InvalidTopicName(
                    f"invalid short topic name {original!r}: use 'topic', 'tenant/namespace/topic' "
                    f"or 'persistent://tenant/namespace/topic'")
        domain, _, rest = name.partition("://")
        if domain not in ("persistent", "non-persistent"):
            raise InvalidTopicName(f"invalid topic domain {domain!r} in {original!r}: use persistent://")
        if domain != "persistent":
            raise InvalidTopicName(f"non-persistent topics are not supported ({original!r}); use persistent://")
        parts = rest.split("/", 2)
        if len(parts) != 3:
            raise InvalidTopicName(f"invalid topic name {original!r}: expected persistent://tenant/namespace/topic")
        tenant, ns, local = parts
        for label, value in (("tenant", tenant), ("namespace", ns)):
            if not value or not _NAME_PART.fullmatch(value):
                raise InvalidTopicName(f"invalid {label} {value!r} in topic {original!r}: "
                                       f"use letters, digits, '-', '_', '=', ':' or '.'")
        if not local or "/" in local or not _LOCAL_PART.fullmatch(local):
            raise InvalidTopicName(f"invalid local topic name {local!r} in {original!r}: "
                                   f"use letters, digits, '-', '_', '=', ':', '%' or '.' (no '/')")
        for label, value in (("tenant", tenant), ("namespace", ns), ("local topic name", local)):
            if value in _PATH_TRICKS:
                raise InvalidTopicName(f"invalid {label} {value!r} in topic {original!r}: '.' and '..' are "
                                       f"path tricks, not names; use a name with letters or digits")
        m = _PARTITION.fullmatch(local)
        if m and len(m.group(2)) > 1 and m.group(2).startswith("0"):
            raise InvalidTopicName(f"invalid partition suffix in topic {original!r}: write the partition index "
                                   f"without leading zeros ({m.group(1)}{PARTITION_SUFFIX}{int(m.group(2))})")
        return cls(domain, tenant, ns, local)

    @property
    def namespace(self) -> str:
        """``"<tenant>/<namespace>"`` (Pulsar's TopicName.getNamespace)."""
        return f"{self.tenant}/{self.namespace_portion}"

    def __str__(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace_portion}/{self.local_name}"

    @property
    def partition_index(self) -> int:
        """N for ``<topic>-partition-N``, else -1."""
        m = _PARTITION.fullmatch(self.local_name)
        return int(m.group(2)) if m else -1

    @property
    def is_partition(self) -> bool:
        """True for a partition ``<topic>-partition-N`` (Pulsar's TopicName.isPartitioned)."""
        return self.partition_index >= 0

    def partition(self, index: int) -> "TopicName":
        """The name of partition ``index`` of this (partitioned) topic."""
        if index < 0:
            raise ValueError(f"invalid partition index {index}")
        return dataclasses.replace(self, local_name=f"{self.local_name}{PARTITION_SUFFIX}{index}")

    @property
    def partitioned_topic_name(self) -> "TopicName":
        """The parent topic of a partition (itself when not a partition)."""
        if not self.is_partition:
            return self
        return dataclasses.replace(self, local_name=self.local_name.rpartition(PARTITION_SUFFIX)[0])

    @property
    def persistence_naming(self) -> str:
        """The managed-ledger name: ``tenant/ns/persistent/topic`` (Pulsar's getPersistenceNamingEncoding)."""
        return f"{self.tenant}/{self.namespace_portion}/persistent/{self.local_name}"
