"""The dashboard's widgets: the sandbox table, the health line, the detail tabs."""
