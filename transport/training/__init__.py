"""A training job over the transport: ranks that alternate compute, collectives, data ingest and checkpoints."""
