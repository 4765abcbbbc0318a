"""Pulsar's binary protocol (port 6650, ``broker_service_port_pulsar``), so the official
Pulsar clients (Java, Go, C++, the ``pulsar-client`` Python package) talk to a
minipulsar broker: ``frames`` (pure codec), ``server_errors`` (exceptions to
ServerError codes), ``connection`` (Pulsar's ServerCnx: one TCP connection),
``producers`` / ``consumers`` (their commands), ``lookups`` (lookup, metadata,
schemas), ``listener`` (the asyncio server)."""
