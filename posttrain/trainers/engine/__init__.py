"""The training engine: one setup sequence (``setup.open_training``), one loop (``run.run``), one registry of the
trainers (``registry.TRAINERS``) and the shape every trainer has (``protocol.Trainer``)."""
