"""The stages behind the CLI: each is a plain function over one documented config dataclass."""
