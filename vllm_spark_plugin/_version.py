"""The plugin's version: one leaf every module reads it from, so none climbs back to the package root
(whose `register()` reaches the inbound side).  pyproject.toml reads it from here."""

__version__ = "0.1.0"
