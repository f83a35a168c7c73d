"""Built-in profiles, shipped with the package."""
