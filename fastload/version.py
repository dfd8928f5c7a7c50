"""The version of fastload: written here once (``pyproject.toml`` reads it, manifests record it)."""

__version__ = "0.1.0"
