"""The broker's wire edges besides the gRPC servicer (DESIGN.md "(protocols)"): each
translates its wire to the transport-neutral service layer (broker/service/) and
holds no delivery rule of its own. ``pulsar``: Pulsar's binary protocol on 6650."""
