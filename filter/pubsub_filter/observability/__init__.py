"""What an operator sees: JSON logs, OpenTelemetry metrics and traces."""
