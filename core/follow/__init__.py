"""Following sandboxes live: the inventory watch and the metrics of every running sandbox,
read through the lifecycle."""
