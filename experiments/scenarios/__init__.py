"""One module per experiment (see experiments.catalogue, which lists them)."""
