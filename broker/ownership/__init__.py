"""Broker clusters: namespace bundles, bundle ownership, lookup and the load manager
(Pulsar's NamespaceService, OwnershipCache, ModularLoadManager). ``bundles`` and
``load_policy`` are pure; ``namespace_service`` does the metadata-store I/O."""
