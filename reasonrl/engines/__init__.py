"""Generation engines: the interface (``base``), one module per engine, the registry (``registry``)."""
