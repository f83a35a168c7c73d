"""What sbx tells the outside: OpenTelemetry spans, event delivery to sinks, supervision
evidence and its signatures, `sbx doctor`."""
