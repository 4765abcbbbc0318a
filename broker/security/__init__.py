"""Broker and bookie security (Pulsar's ``org.apache.pulsar.broker.authentication``
and ``authorization`` packages): JWT tokens (``tokens``), the token
authentication provider, service and gRPC server interceptor
(``authentication``), the authorization model (``authorization``) and the
broker's per-call checks and stream re-checks (``broker_security``)."""
