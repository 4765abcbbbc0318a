"""The broker's HTTP side on its web service port (Pulsar's ``webServicePort`` /
``webServicePortTls``), served with aiohttp: Pulsar's REST admin API
(``/admin/v2/...``, one resource module per noun as Pulsar's
``org.apache.pulsar.broker.admin.v2``), the lookup v2 endpoint, ``/metrics``
and the live dashboard. Each resource only translates HTTP to the admin verbs
of ``broker.service.admin`` (the same ones the gRPC ``Admin`` call runs), with
the same authorization; no rule lives here.
"""
