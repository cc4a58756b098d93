"""Code shared by the SDK and the services: contracts, bus, stores, env engine, observability."""
