"""Assembly: builds an engine and its backends from a config, and names operational failures."""
