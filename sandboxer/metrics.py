"""Container metrics as other tools read them: `prometheus_text` turns the readings of
`AsyncSandboxer.current_metrics()` into the Prometheus text format (node-exporter's textfile
collector reads it; `sbx metrics --all --format prometheus` prints it)."""

from __future__ import annotations

from sandboxer.core.follow.containermetrics import prometheus_text

__all__ = ["prometheus_text"]
